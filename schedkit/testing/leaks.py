"""Finding what a test left running: assemblies never shut down, threads, ZeroMQ sockets and
contexts.

``LeakCheck`` watches from ``start()`` to ``finish()``:

- assemblies: ``schedkit.assembly.container.build_hooks`` hands it every assembly ``build``
  returns; one not shut down by ``finish()`` is a leak, reported with the components
  ``shutdown()`` would have stopped and where it was built. The check then shuts it down, so
  that what it holds does not spill into later tests.
- threads: those alive at ``finish()`` that were not alive at ``start()``, after waiting up to
  ``join_timeout`` seconds in total for them to end (daemon threads included).
- ZeroMQ: while the check runs, ``zmq.Socket.__init__`` and ``zmq.Context.__init__`` are wrapped
  to remember (weakly) each socket and context created, with the component (found on the
  creating call stack) and source line that created it. A socket still open, or a context not
  terminated, at ``finish()`` is a leak (the process-wide ``zmq.Context.instance()`` excepted).
  Sockets created through the wrapped constructors only: a C extension creating its own
  libzmq sockets is not seen.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any

import attrs

__all__ = ["LeakCheck", "LeakError"]

# Frames from these directories are not "where" a resource was created.
_SKIP_DIRS = (os.sep + "zmq" + os.sep, os.path.dirname(__file__) + os.sep)


class LeakError(AssertionError):
    """Resources outlived the checked block; the message names each."""


@attrs.define(eq=False)
class _Created:
    """Who created a socket or context: the component (if any) and the source line."""

    component: str | None
    owner_id: int | None
    where: str

    def describe(self, names: dict[int, str]) -> str:
        name = names.get(self.owner_id)
        if name is not None:
            return f"component {name} ({self.component}) at {self.where}"
        return f"{self.component} at {self.where}" if self.component else self.where


def _creator(frame: FrameType | None) -> _Created:
    from schedkit.core.component import is_component

    where = None
    while frame is not None:
        file = frame.f_code.co_filename
        if where is None and not any(d in file for d in _SKIP_DIRS):
            where = f"{os.path.relpath(file)}:{frame.f_lineno}"
        owner = frame.f_locals.get("self")
        if owner is not None and is_component(type(owner)):
            return _Created(type(owner).__name__, id(owner), where or "<unknown>")
        frame = frame.f_back
    return _Created(None, None, where or "<unknown>")


@attrs.define(eq=False)
class _Built:
    assembly: Any
    where: str
    components: dict[int, str]  # id(instance) -> component name, for naming socket owners


class LeakCheck:
    """Records resources created between ``start()`` and ``finish()`` and reports those left.

    Use as a context manager (raises ``LeakError`` on leaks) or call ``start()`` and
    ``finish() -> list[str]`` (one message per leak) yourself.
    """

    def __init__(self, join_timeout: float = 1.0) -> None:
        self.join_timeout = join_timeout
        self._threads: set[threading.Thread] = set()
        self._assemblies: list[_Built] = []
        self._sockets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._contexts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._restore: list[tuple[type, str, Any]] = []
        self._started = False

    @property
    def active(self) -> bool:
        """True between ``start()`` and ``finish()``."""
        return self._started

    def start(self) -> LeakCheck:
        """Begin watching."""
        import zmq

        from schedkit.assembly import container

        if self._started:
            raise RuntimeError("LeakCheck.start() called twice")
        self._started = True
        self._threads = set(threading.enumerate())
        container.build_hooks.append(self._on_build)
        self._wrap(zmq.Socket, self._sockets)
        self._wrap(zmq.Context, self._contexts)
        return self

    def _wrap(self, cls: type, registry: weakref.WeakKeyDictionary) -> None:
        original = cls.__dict__["__init__"]

        def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
            original(obj, *args, **kwargs)
            if not getattr(obj, "_shadow", False):  # a shadow does not own the handle
                registry[obj] = _creator(sys._getframe(1))

        __init__.__wrapped__ = original
        cls.__init__ = __init__
        self._restore.append((cls, "__init__", original))

    def _on_build(self, assembly: Any) -> None:
        frame = sys._getframe(2)  # build() called us; its caller built the assembly
        components = {id(assembly[name]): name for name in assembly.names()}
        self._assemblies.append(_Built(assembly, _creator(frame).where, components))

    def finish(self) -> list[str]:
        """Stop watching; shut down leaked assemblies; return one message per leak."""
        from schedkit.assembly import container

        if not self._started:
            raise RuntimeError("LeakCheck.finish() without start()")
        self._started = False
        for cls, name, original in reversed(self._restore):
            setattr(cls, name, original)
        self._restore.clear()
        if self._on_build in container.build_hooks:
            container.build_hooks.remove(self._on_build)
        problems = [self._shut_leaked(built) for built in self._assemblies if not _shut(built)]
        names = {}
        for built in self._assemblies:
            names.update(built.components)
        problems += self._threads_left()
        problems += self._zmq_left(names)
        return problems

    def _shut_leaked(self, built: _Built) -> str:
        assembly = built.assembly
        running = [
            f"{name} ({type(assembly[name]).__name__})"
            for name in reversed(assembly.names())
            if _stoppable(assembly[name])
        ]
        held = running or [f"{name}" for name in assembly.names()]
        what = "components left running" if running else "components"
        try:
            assembly.shutdown()
            after = "the leak check shut it down"
        except Exception as exc:
            after = f"shutting it down raised {type(exc).__name__}: {exc}"
        return (
            f"assembly built at {built.where} was never shut down; {what}: {', '.join(held)} "
            f"({after}). Call assembly.shutdown(), use `with schedkit.build(...) as assembly:`, "
            f"or build it with the make_assembly fixture"
        )

    def _threads_left(self) -> list[str]:
        deadline = time.monotonic() + self.join_timeout
        left = []
        for thread in threading.enumerate():
            if thread in self._threads or thread is threading.current_thread():
                continue
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                left.append(thread)
        problems = []
        for thread in left:
            target = getattr(thread, "_target", None)
            runs = f" running {getattr(target, '__qualname__', target)}" if target else ""
            kind = "daemon thread" if thread.daemon else "thread"
            problems.append(f"{kind} {thread.name!r}{runs} is still alive")
        return problems

    def _zmq_left(self, names: dict[int, str]) -> list[str]:
        import zmq

        problems = []
        for sock, created in list(self._sockets.items()):
            if sock.closed:
                continue
            try:
                endpoint = sock.getsockopt(zmq.LAST_ENDPOINT).decode() or "no endpoint"
                kind = zmq.SocketType(sock.type).name
            except zmq.ZMQError:
                endpoint, kind = "no endpoint", "ZeroMQ"
            problems.append(
                f"{kind} socket ({endpoint}) created by {created.describe(names)} is still open"
            )
        singleton = getattr(zmq.Context, "_instance", None)
        for context, created in list(self._contexts.items()):
            if not context.closed and context is not singleton:
                problems.append(
                    f"ZeroMQ context created by {created.describe(names)} was never terminated"
                )
        return problems

    def __enter__(self) -> LeakCheck:
        return self.start()

    def __exit__(self, exc_type: object, *_: object) -> None:
        problems = self.finish()
        if problems and exc_type is None:
            raise LeakError(format_leaks(problems))


def format_leaks(problems: list[str]) -> str:
    """One message listing every leak."""
    return "resources leaked by the test:\n" + "\n".join(f"  - {p}" for p in problems)


def _shut(built: _Built) -> bool:
    return built.assembly.is_shut_down


def _stoppable(instance: Any) -> bool:
    return callable(getattr(instance, "shutdown", None)) or callable(
        getattr(instance, "close", None)
    )
