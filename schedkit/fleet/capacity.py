"""How many fleet workers this machine can hold, so that ``--workers 10000`` is refused up
front instead of starting processes or building assemblies until memory runs out.

Live: each worker is a process of its own (about 60 MiB resident on the built-in wiring;
``LIVE_WORKER_MIB`` keeps headroom) whose latencies are wall-clock measurements, so the fleet
takes at most ``LIVE_WORKERS_PER_CORE`` workers per core this process may run on (a worker
sleeps through most of each simulated step) and as many as the available memory holds.
Offline: every worker is an assembly in this process; the memory one takes is measured on
the first ones built and the rest must fit in the available memory.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "LIVE_WORKERS_PER_CORE",
    "LIVE_WORKER_MIB",
    "FleetCapacityError",
    "available_mib",
    "check_live_workers",
    "check_offline_workers",
    "current_rss_mib",
    "usable_cores",
]

LIVE_WORKER_MIB = 100
LIVE_WORKERS_PER_CORE = 4
OVERRIDE = "--no-worker-cap"


class FleetCapacityError(RuntimeError):
    """More workers than this machine can hold (the message says which resource and how to
    override)."""


def usable_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_mib() -> float:
    """Memory available to new work (MemAvailable on Linux, free pages elsewhere), MiB."""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20


def current_rss_mib() -> float:
    """This process's resident memory now (not its peak), MiB."""
    statm = Path("/proc/self/statm")
    if statm.exists():
        return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    import resource  # no /proc: the peak is the best figure there is

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if os.uname().sysname == "Darwin" else peak / 1024


def check_live_workers(num_workers: int) -> None:
    """``FleetCapacityError`` when ``num_workers`` live workers exceed the cores or memory."""
    cores = usable_cores()
    by_cores = cores * LIVE_WORKERS_PER_CORE
    by_memory = int(available_mib() // LIVE_WORKER_MIB)
    if num_workers > by_cores:
        raise FleetCapacityError(
            f"{num_workers} live workers on {cores} core(s): at most {by_cores} "
            f"({LIVE_WORKERS_PER_CORE} per core); their latencies are wall-clock measurements. "
            f"Use fewer workers, --offline, or {OVERRIDE} to start them anyway"
        )
    if num_workers > by_memory:
        raise FleetCapacityError(
            f"{num_workers} live workers need about {num_workers * LIVE_WORKER_MIB} MiB "
            f"({LIVE_WORKER_MIB} MiB each) and {available_mib():.0f} MiB are available: at "
            f"most {by_memory}. Use fewer workers or {OVERRIDE} to start them anyway"
        )


def check_offline_workers(num_workers: int, built: int, per_worker_mib: float) -> None:
    """``FleetCapacityError`` when the ``num_workers - built`` assemblies still to build, at
    ``per_worker_mib`` each (measured), exceed the available memory."""
    need = (num_workers - built) * per_worker_mib
    free = available_mib()
    if need > free:
        most = built + int(free // per_worker_mib) if per_worker_mib > 0 else num_workers
        raise FleetCapacityError(
            f"{num_workers} offline workers: each takes about {per_worker_mib:.1f} MiB "
            f"(measured on the first {built}), {need:.0f} MiB more than the {free:.0f} MiB "
            f"available: at most {most}. Use fewer workers or {OVERRIDE} to build them anyway"
        )
