"""Starting live fleet workers: as spawned processes, or as Ray actors (the ``ray`` extra).

A launcher's ``launch(spec)`` starts one worker and returns a handle with ``is_alive()``,
``kill()``, ``join(timeout)`` and a ``sentinel``: a file descriptor that becomes readable once
the worker has exited, which the router polls with its sockets; ``exit_reason(handle)`` says
how a worker that is gone ended. ``close()``, once every worker has stopped, releases what
the launcher holds.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from multiprocessing.process import BaseProcess
from typing import Any

import attrs

from schedkit.fleet.worker import WorkerSpec, worker_main

__all__ = [
    "LAUNCHERS",
    "ProcessLauncher",
    "RayHandle",
    "RayLauncher",
    "WorkerStartError",
    "exit_reason",
]


class WorkerStartError(RuntimeError):
    """A worker could not start (its message says why)."""


class ProcessLauncher:
    """Each worker a spawned process (``multiprocessing.Process`` is the handle)."""

    def launch(self, spec: WorkerSpec) -> BaseProcess:
        """Start ``worker_main(spec)`` in a spawned process."""
        process = multiprocessing.get_context("spawn").Process(
            target=worker_main, args=(spec,), name=f"schedkit-fleet-worker-{spec.rank}", daemon=True
        )
        process.start()
        return process

    def close(self) -> None:
        """Nothing to release: the processes were joined by the fleet."""


def exit_reason(handle: Any) -> str:
    """How a worker that is no longer alive ended: its handle's ``exit_reason()`` (a Ray
    actor's), else a process's exit code or the signal that killed it."""
    if hasattr(handle, "exit_reason"):
        return handle.exit_reason()
    code = handle.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _RayWorker:
    def run(self, spec: WorkerSpec) -> None:
        worker_main(spec)


@attrs.define
class RayHandle:
    """A worker running as a Ray actor, with the process handle's methods.

    ``done`` is the actor's ``run`` call; when it resolves (the worker returned, or the actor
    died) a byte is written to a pipe whose read end is the ``sentinel``.
    """

    actor: Any
    done: Any
    sentinel: int
    _signal: int
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _closed: bool = False

    @classmethod
    def start(cls, actor: Any, done: Any) -> RayHandle:
        """Wrap a started ``run`` call ``done`` of ``actor``."""
        read, write = os.pipe()
        handle = cls(actor, done, read, write)
        done.future().add_done_callback(handle._on_done)
        return handle

    def _on_done(self, _: object) -> None:
        # Called on a Ray thread, possibly after close(): the descriptor may be reused by then.
        with self._lock:
            if not self._closed:
                os.write(self._signal, b"x")

    def is_alive(self) -> bool:
        """True until the worker returned or its actor died."""
        import ray

        ready, _ = ray.wait([self.done], timeout=0)
        return not ready

    def exit_reason(self) -> str:
        """The exception that ended the actor's ``run`` call (it died, or raised before the
        worker could report), or that it returned."""
        import ray

        try:
            ray.get(self.done, timeout=0)
        except Exception as exc:
            first_line = (str(exc).strip().splitlines() or [""])[0]
            return f"{type(exc).__name__}: {first_line}"
        return "it returned"

    def kill(self) -> None:
        """Kill the actor outright (as a crash would)."""
        import ray

        ray.kill(self.actor)

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for the worker to return or die."""
        import ray

        ray.wait([self.done], timeout=timeout)

    def close(self) -> None:
        """Close the sentinel's pipe."""
        with self._lock:
            self._closed = True
            os.close(self.sentinel)
            os.close(self._signal)


class RayLauncher:
    """Each worker a Ray actor on this node (its endpoints are on loopback).

    Uses a Ray already initialised in this process, or calls ``ray.init()`` and then
    ``close()`` shuts Ray down again; a Ray the caller had initialised is left running, only
    the fleet's actors are killed.
    """

    def __init__(self) -> None:
        try:
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        except ImportError:
            raise WorkerStartError(
                "--launcher ray needs Ray: pip install 'schedkit[ray]'"
            ) from None
        self.started_ray = not ray.is_initialized()
        if self.started_ray:
            try:
                ray.init(include_dashboard=False, log_to_driver=False)
            except (OSError, RuntimeError, ValueError) as exc:
                raise WorkerStartError(f"could not start Ray: {exc}") from None
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._actor_class = ray.remote(num_cpus=0, scheduling_strategy=here)(_RayWorker)
        self.handles: list[RayHandle] = []

    def launch(self, spec: WorkerSpec) -> RayHandle:
        """Start ``worker_main(spec)`` in a new actor."""
        actor = self._actor_class.remote()
        # Ray ends an actor whose owner is gone; the worker does not watch a parent pid.
        handle = RayHandle.start(actor, actor.run.remote(attrs.evolve(spec, parent_pid=None)))
        self.handles.append(handle)
        return handle

    def close(self) -> None:
        """Kill the actors (the fleet has stopped or given up on them), close the sentinels,
        and shut Ray down if this launcher started it."""
        import ray

        for handle in self.handles:
            ray.kill(handle.actor)
            handle.close()
        self.handles.clear()
        if self.started_ray:
            ray.shutdown()


LAUNCHERS: dict[str, type] = {"process": ProcessLauncher, "ray": RayLauncher}
