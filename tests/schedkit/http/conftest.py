import pytest

from schedkit.testing.serving import start_http_serve, stop_serve


@pytest.fixture(scope="package")
def http_server():
    """One ``schedkit serve --http`` for the package's tests that need no special settings:
    (process, base URL)."""
    server, url, _ = start_http_serve()
    yield server, url
    assert stop_serve(server) == 0
