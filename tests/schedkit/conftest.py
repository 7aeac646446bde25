import pytest

from tests.schedkit import sample_components


@pytest.fixture(autouse=True)
def _clear_sample_events():
    sample_components.EVENTS.clear()
    yield
    sample_components.EVENTS.clear()


@pytest.fixture
def write(tmp_path):
    """Write a YAML file under tmp_path and return its path."""

    def write(name: str, text: str):
        path = tmp_path / name
        path.write_text(text)
        return path

    return write
