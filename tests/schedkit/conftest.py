import pytest

from schedkit import build
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


@pytest.fixture
def built():
    """``schedkit.build`` whose assemblies are shut down after the test."""
    assemblies = []

    def built(*args, **kwargs):
        assembly = build(*args, **kwargs)
        assemblies.append(assembly)
        return assembly

    yield built
    for assembly in assemblies:
        assembly.shutdown()


@pytest.fixture
def default_recursion_limit():
    """Python's default recursion limit (1,000), which bounds how deep msgspec follows a
    value, for the duration of the test (another test may have raised it)."""
    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    yield
    sys.setrecursionlimit(old)
