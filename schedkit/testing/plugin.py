"""The schedkit pytest plugin, loaded through the ``pytest11`` entry point ``schedkit``.

Fixtures:

- ``make_assembly(source=None, overlays=(), overrides=None) -> Assembly`` builds an assembly
  (``source`` None: ``wiring.yaml`` here or at the pytest root, else the shipped wiring) and
  shuts it down at teardown; the test is also under ``assembly_leak_check``.
- ``fake_component(key, **attributes)``: a recording double of the protocol under a wiring
  key, which raises ``UnconfiguredCall`` for a return value it was not given.
- ``assembly_leak_check``: the test fails at teardown if it leaves an assembly not shut down
  (naming its components), a thread, or a ZeroMQ socket or context behind. See
  ``schedkit.testing.leaks``.

The ini option ``schedkit_leak_check`` is ``fixture`` (default: tests that use one of these
fixtures are checked) or ``all`` (every test is); ``schedkit_leak_check_timeout`` (default 1.0)
is how many seconds in total the check waits for a test's threads to end. This module imports
only pytest; the rest of schedkit loads when a fixture is used.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

_MODES = ("fixture", "all")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "schedkit_leak_check",
        "which tests schedkit's leak check covers: 'fixture' (tests using make_assembly or "
        "assembly_leak_check) or 'all'",
        default="fixture",
    )
    parser.addini(
        "schedkit_leak_check_timeout",
        "seconds the leak check waits in total for threads started by a test to end (default 1.0)",
        default="1.0",
    )


def pytest_configure(config: pytest.Config) -> None:
    mode = config.getini("schedkit_leak_check")
    if mode not in _MODES:
        raise pytest.UsageError(
            f"schedkit_leak_check = {mode!r} is not valid; use one of: {', '.join(_MODES)}"
        )
    _join_timeout(config)


def _join_timeout(config: pytest.Config) -> float:
    text = config.getini("schedkit_leak_check_timeout")
    try:
        timeout = float(text)
    except ValueError:
        timeout = -1.0
    if not timeout >= 0:
        raise pytest.UsageError(
            f"schedkit_leak_check_timeout = {text!r} is not valid; give seconds >= 0, e.g. 1.0"
        )
    return timeout


def pytest_runtest_setup(item: pytest.Item) -> None:
    doubles = sys.modules.get("schedkit.testing.doubles")
    if doubles is not None:  # each test sees only the capturing publishers it created
        doubles.CapturingEventPublisher.instances.clear()


@pytest.fixture
def assembly_leak_check(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Fail the test at teardown if it leaves assemblies, threads or ZeroMQ sockets behind;
    yields the running ``schedkit.testing.LeakCheck``."""
    from schedkit.testing.leaks import LeakCheck, format_leaks

    check = LeakCheck(join_timeout=_join_timeout(request.config)).start()
    yield check
    problems = check.finish()
    if problems:
        pytest.fail(format_leaks(problems), pytrace=False)


@pytest.fixture(autouse=True)
def _schedkit_leak_check_all(request: pytest.FixtureRequest) -> None:
    if request.config.getini("schedkit_leak_check") == "all":
        request.getfixturevalue("assembly_leak_check")


def _resolve(source: Any, rootpath: Path) -> Any:
    """A relative path that does not exist from the working directory is tried from the
    pytest root directory (so ``make_assembly()`` finds the project's wiring.yaml)."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_absolute() and not path.exists() and (rootpath / path).exists():
            return rootpath / path
    return source


@pytest.fixture
def make_assembly(
    request: pytest.FixtureRequest, assembly_leak_check: Any
) -> Iterator[Callable[..., Any]]:
    """A factory ``make_assembly(source=None, overlays=(), overrides=None)`` that loads,
    validates and builds a wiring (``source`` None: ``wiring.yaml`` in the working directory or
    the pytest root directory, else the wiring shipped with schedkit); every assembly it made
    is shut down at teardown."""
    from schedkit import wirings
    from schedkit.assembly.container import build
    from schedkit.assembly.loading import load_wiring
    from schedkit.assembly.wiring import Wiring
    from schedkit.testing import doubles  # noqa: F401  registers the "capture" publisher

    built = []
    rootpath = request.config.rootpath

    def make(
        source: str | os.PathLike | Mapping | Wiring | None = None,
        overlays: Sequence[str | os.PathLike | Mapping] = (),
        overrides: Mapping[str, object] | None = None,
    ) -> Any:
        if source is None:
            source = wirings.default_source(rootpath)
        if isinstance(source, Wiring):
            if overlays:
                raise TypeError(
                    "make_assembly(): overlays apply to a file or mapping, not a Wiring"
                )
            wiring = source
        else:
            wiring = load_wiring(
                _resolve(source, rootpath), *(_resolve(o, rootpath) for o in overlays)
            )
        assembly = build(wiring, overrides=overrides)
        built.append(assembly)
        return assembly

    yield make
    errors = []
    for assembly in reversed(built):
        try:
            assembly.shutdown()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    if errors:
        pytest.fail("shutting down assemblies failed:\n" + "\n".join(errors), pytrace=False)


@pytest.fixture
def fake_component() -> Callable[..., Any]:
    """A factory ``fake_component(key, returns=None, side_effects=None, **attributes)``: a
    recording double of the protocol of the component under wiring key ``key``
    (``schedkit.core.protocols.COMPONENT_PROTOCOLS``), e.g. ``fake_component("load_inquirer",
    returns={"get_loads": {...}})``. A method that returns something raises
    ``UnconfiguredCall`` unless its return value (or side effect) was given."""
    from schedkit.core.protocols import COMPONENT_PROTOCOLS
    from schedkit.testing.fakes import fake

    def make(key: str, /, **options: Any) -> Any:
        protocol = COMPONENT_PROTOCOLS.get(key)
        if protocol is None:
            raise KeyError(
                f"no component protocol under the wiring key {key!r}; keys: "
                f"{', '.join(sorted(COMPONENT_PROTOCOLS))}"
            )
        return fake(protocol, **options)

    return make


@pytest.fixture
def faulty_kv_publisher(assembly_leak_check: Any) -> Iterator[Callable[..., Any]]:
    """A factory ``faulty_kv_publisher(config=None, dp_rank=0)`` of ``FaultyPublisher``s (loopback,
    free ports by default): KV-event publishers that drop, duplicate, hold, reorder, burst
    and restart on demand. Every one it made is shut down at teardown."""
    from schedkit.testing.faults import FaultyPublisher

    made = []

    def make(config: Any = None, dp_rank: int = 0) -> Any:
        made.append(FaultyPublisher(config, dp_rank))
        return made[-1]

    yield make
    for publisher in made:
        publisher.shutdown()
