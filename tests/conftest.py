import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests import parallel
from tests.wheel import WheelBuild, build_wheel, install_wheel, published

_EARLY_WHEEL = pytest.StashKey[WheelBuild]()
_SHARED_WHEEL: list[WheelBuild] = []  # on an xdist worker, the build it started if it did


def _compile_once() -> str | None:
    """With ``PYTHONDONTWRITEBYTECODE`` set, every Python process a test starts compiles each
    module of the project it imports anew (~0.13 s of CPU for a short `schedkit run`). Keep
    the checkout free of bytecode but compile once per session: bytecode goes to a temporary
    ``PYTHONPYCACHEPREFIX`` that this process and every process it starts share."""
    if not sys.flags.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX"):
        return None
    prefix = tempfile.mkdtemp(prefix="schedkit-test-bytecode-")
    atexit.register(shutil.rmtree, prefix, ignore_errors=True)  # after the last import here
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False
    return prefix


_BYTECODE = _compile_once()


def _rewrite_no_plugin_distributions() -> None:
    """pytest rewrites the asserts of every module of each installed distribution that
    registers a pytest plugin (hypothesis, anyio, and schedkit itself: ~290 modules, whose
    syntax trees it walks on import, ~1.5 s of CPU per session); none of them asserts anything
    a test reads (schedkit has no assert statement). By the time this file is imported only
    those distributions are marked: unmarked, they import as any library does. Test modules,
    conftest files and what a test module registers (pytester's assertions) are still
    rewritten. Reaches into pytest's import hook; where it is not there, nothing changes."""
    for finder in sys.meta_path:
        marked = getattr(finder, "_must_rewrite", None)
        cache = getattr(finder, "_marked_for_rewrite_cache", None)
        if isinstance(marked, set) and isinstance(cache, dict):
            marked.clear()
            cache.clear()


_rewrite_no_plugin_distributions()

_SHARED, _MADE_SHARED = parallel.shared_directory()
# Read already (.ci/run sets the two workers there); the pytest processes tests start (docs
# blocks, the first hour's project, pytester) run their own tests one at a time.
os.environ.pop("PYTEST_ADDOPTS", None)


def pytest_configure(config: pytest.Config) -> None:
    """xdist sends out files with the most tests first unless told otherwise: keep the order
    pytest_collection_modifyitems gives instead."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On xdist workers, the tests that may run beside others first, so that both workers run
    those together (tests/parallel.py)."""
    if parallel.on_a_worker():
        order = parallel.run_order([item.nodeid for item in items])
        items[:] = [items[index] for index in order]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """On xdist workers, a test not listed in tests/parallel.py runs alone."""
    if not parallel.on_a_worker():
        return (yield)
    with parallel.turn(_SHARED, alone=not parallel.beside_others(item.nodeid)):
        return (yield)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the wheel as soon as the tests that need it are known: the build (pip
    in a process of its own) runs beside the tests that come before them."""
    if session.config.option.collectonly:
        return
    if any("wheel" in getattr(item, "fixturenames", ()) for item in session.items):
        if parallel.on_a_worker():
            _start_shared_wheel()
            return
        where = Path(tempfile.mkdtemp(prefix="schedkit-wheel-"))
        session.config.stash[_EARLY_WHEEL] = WheelBuild(where)


def _start_shared_wheel() -> None:
    """On xdist workers: start the one build of the wheel that both share, unless the other
    worker has; it appears as ``wheel`` in the shared directory (tests/wheel.py)."""
    with parallel.one_at_a_time(_SHARED / "wheel.lock"):
        started = _SHARED / "wheel.started"
        if not started.exists():
            started.touch()
            where = Path(tempfile.mkdtemp(dir=_SHARED))
            _SHARED_WHEEL.append(WheelBuild(where, publish=_SHARED / "wheel"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    for shared in _SHARED_WHEEL:
        shared.join()  # not stopped: the other worker's tests may still wait for it
    build = session.config.stash.get(_EARLY_WHEEL, None)
    if build is not None:
        build.cancel()
        shutil.rmtree(build.where, ignore_errors=True)
    if _BYTECODE is not None:
        sys.dont_write_bytecode = True
        shutil.rmtree(_BYTECODE, ignore_errors=True)
    if _MADE_SHARED:
        parallel.remove(_SHARED)


@pytest.fixture(autouse=True)
def _logging_kept():
    """Every test leaves the logging setup (structlog's configuration, the stdlib loggers) as
    it found it: a test that configures logging, or runs a command's ``main()`` in-process,
    would otherwise hand its setup (and the stream it wrote to, closed by then) to the tests
    after it."""
    from tests.logging_state import logging_kept  # schedkit imports after the rewrite hook's reset

    with logging_kept():
        yield


@pytest.fixture(scope="session")
def wheel(request, tmp_path_factory):
    """schedkit's wheel, built once per test session from a clean copy of the source tree."""
    build = request.config.stash.get(_EARLY_WHEEL, None)
    if build is not None:
        return build.wait()
    if not parallel.on_a_worker():
        return build_wheel(tmp_path_factory.mktemp("wheel"))
    _start_shared_wheel()  # one build for both workers, most often started at collection
    return published(_SHARED / "wheel")


@pytest.fixture(scope="session")
def installed_wheel(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed, made once per session: the tests
    that take it run what it installed and install nothing more."""
    if not parallel.on_a_worker():
        return install_wheel(wheel, tmp_path_factory.mktemp("installed") / "venv")
    venv, done = _SHARED / "installed", _SHARED / "installed.done"  # one for both workers
    with parallel.one_at_a_time(_SHARED / "installed.lock"):
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            install_wheel(wheel, venv)
            done.touch()
    return venv
