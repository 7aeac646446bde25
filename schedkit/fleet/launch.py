"""Starting live fleet workers: as spawned processes, or as Ray actors (the ``ray`` extra).

A launcher takes a ``WorkerSpec`` and returns a handle with ``is_alive()``, ``kill()`` and
``join(timeout)``; a process handle also has a ``sentinel`` the router polls to see its exit.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import attrs

from schedkit.fleet.worker import WorkerSpec, worker_main

__all__ = ["LAUNCHERS", "RayHandle", "WorkerStartError", "launch_process", "launch_ray"]


class WorkerStartError(RuntimeError):
    """A worker could not start (its message says why)."""


def launch_process(spec: WorkerSpec) -> Any:
    """Start ``worker_main(spec)`` in a spawned process."""
    process = multiprocessing.get_context("spawn").Process(
        target=worker_main, args=(spec,), name=f"schedkit-fleet-worker-{spec.rank}", daemon=True
    )
    process.start()
    return process


class _RayWorker:
    def run(self, spec: WorkerSpec) -> None:
        worker_main(spec)


@attrs.define
class RayHandle:
    """A worker running as a Ray actor, with the process handle's methods."""

    actor: Any
    done: Any

    def is_alive(self) -> bool:
        import ray

        ready, _ = ray.wait([self.done], timeout=0)
        return not ready

    def kill(self) -> None:
        import ray

        ray.kill(self.actor)

    def join(self, timeout: float | None = None) -> None:
        import ray

        ray.wait([self.done], timeout=timeout)


def launch_ray(spec: WorkerSpec) -> RayHandle:
    """Start ``worker_main(spec)`` in a Ray actor (``pip install 'schedkit[ray]'``)."""
    try:
        import ray
    except ImportError:
        raise WorkerStartError("--launcher ray needs Ray: pip install 'schedkit[ray]'") from None
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    actor = ray.remote(num_cpus=0)(_RayWorker).remote()
    return RayHandle(actor, actor.run.remote(attrs.evolve(spec, parent_pid=None)))


LAUNCHERS: dict[str, Callable[[WorkerSpec], Any]] = {"process": launch_process, "ray": launch_ray}
