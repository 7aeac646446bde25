import pytest

from tests.wheel import build_wheel


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """schedkit's wheel, built once per test session from a clean copy of the source tree."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))
