import shutil
import tempfile
from pathlib import Path

import pytest

from tests.wheel import WheelBuild, build_wheel

_EARLY_WHEEL = pytest.StashKey[WheelBuild]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the wheel as soon as the tests that need it are known: the build (pip
    in a process of its own) runs beside the tests that come before them."""
    if session.config.option.collectonly:
        return
    if any("wheel" in getattr(item, "fixturenames", ()) for item in session.items):
        where = Path(tempfile.mkdtemp(prefix="schedkit-wheel-"))
        session.config.stash[_EARLY_WHEEL] = WheelBuild(where)


def pytest_sessionfinish(session: pytest.Session) -> None:
    build = session.config.stash.get(_EARLY_WHEEL, None)
    if build is not None:
        build.cancel()
        shutil.rmtree(build.where, ignore_errors=True)


@pytest.fixture(scope="session")
def wheel(request, tmp_path_factory):
    """schedkit's wheel, built once per test session from a clean copy of the source tree."""
    build = request.config.stash.get(_EARLY_WHEEL, None)
    if build is None:
        return build_wheel(tmp_path_factory.mktemp("wheel"))
    return build.wait()
