import pytest
import structlog


@pytest.fixture(autouse=True)
def _default_structlog():
    """Start from structlog's defaults: components log while these tests build them, and an
    earlier test may have configured structlog to write to a stream that is closed by now."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
