"""A fleet of N schedulers behind a router, in one process on one virtual timeline.

Each worker is a whole assembly built from the wiring, as DP rank ``r`` of ``N``; its KV
events go out through the ``queue`` publisher (``schedkit.fleet.events``), encoded as on the
wire, and the router decodes them into its ``KvIndex``. Time moves as a discrete-event
simulation over the workers' virtual clocks: the busy worker furthest behind steps next (the
busy workers wait in a heap by clock), and an arrival is routed once every busy worker's clock
has reached it (idle workers' clocks jump there). When the end of a request cannot bring a
routing decision forward (a workload with no follow-up requests, no router queue), each worker
instead runs on its own up to the next arrival, at most ``_HORIZON`` ahead of the one furthest
behind, and the requests that ended are handed over in the order of the steps that ended them:
the same numbers either way. The router learns what a step did (its KV events, first tokens,
finished requests, the worker's KV usage and queue) at the step's end time, applied when it
next routes: a request is routed on what happened up to then, not on a step that another
worker's clock has run past it (a worker in the middle of a long prefill does not look idle).
Admission control
(``schedkit.fleet.admission``) acts at the same moments: a request waiting at the router is
sent when a worker's request ends, at that worker's time, once every busy worker has reached
it; a timeout falls due like an arrival. The same wiring, workload and seed give the same
numbers. The wiring's model runner should run on the virtual clock
(the default); on the wall clock every step would also take its time. The loop is
``offline_fleet.OfflineFleet``, its two ways of stepping in ``offline_stepping``; what the
router is told is in ``router_news``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from schedkit.assembly.container import build
from schedkit.assembly.loading import load_wiring
from schedkit.assembly.wiring import Wiring, WiringError, call
from schedkit.fleet.admission import AdmissionLimits
from schedkit.fleet.capacity import check_offline_workers, current_rss_mib
from schedkit.fleet.offline_fleet import OfflineFleet
from schedkit.fleet.records import RecordRequest
from schedkit.fleet.summary import FleetSummary
from schedkit.kv_events import KvEventsConfig
from schedkit.router import make_policy
from schedkit.workloads.workload import Workload

__all__ = ["OfflineFleet", "kv_events_config", "run_offline", "worker_wiring"]

_runs = itertools.count()


def kv_events_config(wiring: Wiring) -> tuple[str, KvEventsConfig] | None:
    """The component publishing KV events and its config, or None when events are off."""
    for name, spec in wiring.components.items():
        config = spec.args.get("kv_events_config")
        if isinstance(config, KvEventsConfig):
            return name, config
    return None


def worker_wiring(
    file: str | os.PathLike,
    overlays: Sequence[str | os.PathLike | dict],
    rank: int,
    num_workers: int,
    kv_events: dict | None = None,
) -> Wiring:
    """The wiring of worker ``rank``: the file and overlays as DP rank ``rank`` of
    ``num_workers``, with ``kv_events`` (keys of ``KvEventsConfig``) over its KV-event
    config."""
    wiring = load_wiring(file, *overlays, _rank_overlay(rank, num_workers))
    found = kv_events_config(wiring)
    if kv_events is None or found is None:
        return wiring
    name, config = found
    merged = {**msgspec.structs.asdict(config), **kv_events}
    events_overlay = {"components": {name: {"args": {"kv_events_config": merged}}}}
    return load_wiring(file, *overlays, _rank_overlay(rank, num_workers), events_overlay)


def _rank_overlay(rank: int, num_workers: int) -> dict:
    return {"components": {"parallel_state": {"args": {"dp_size": num_workers, "dp_rank": rank}}}}


def run_offline(
    file: str | os.PathLike,
    workload: Workload,
    num_workers: int,
    policy: str = "kv",
    *,
    overlays: Sequence[str | os.PathLike | dict] = (),
    settings: Mapping[str, float] | None = None,
    progress: Callable[[int, float], None] | None = None,
    admission: AdmissionLimits | None = None,
    replay: str = "open loop",
    record: RecordRequest | None = None,
    cap_workers: bool = True,
    decode_runs: bool = True,
) -> FleetSummary:
    """Route ``workload`` over ``num_workers`` schedulers built from ``file`` (+ overlays)
    with the routing ``policy`` (and its ``settings``, see ``make_policy``) under
    ``admission`` and summarise the run (see the module docstring). ``replay`` names how the
    workload is replayed (for the summary); ``record(req, worker, outcome, start)`` sees every
    request that ends. With ``cap_workers``, ``FleetCapacityError`` when the assemblies would
    not fit in the available memory (measured on the first two built). With
    ``decode_runs`` a worker advances an unchanging decode batch several steps at once
    (``Stepper.run_decode``; the same results as step by step), and an ``output_tally``
    sender that was not told otherwise counts outputs without encoding them (a replay reports
    no encoded bytes)."""
    if num_workers < 1:
        raise ValueError(f"a fleet needs at least one worker, got {num_workers}")
    settings = dict(settings or {})
    # A bad name or setting fails before anything is built.
    uses_prefix = make_policy(policy, **settings).uses_prefix
    endpoint = f"inproc://schedkit-fleet-{os.getpid()}-{next(_runs)}"
    overlays, first, same = _first_wiring(
        file, overlays, num_workers, _queue_events(endpoint), count_outputs=decode_runs
    )
    found = kv_events_config(first)
    if found is None and uses_prefix:
        raise WiringError(
            f"{Path(file)}: routing by prefix needs the workers' KV events; give the "
            "kv_events_publisher a kv_events_config"
        )
    with contextlib.ExitStack() as stack:
        started = time.perf_counter()
        assemblies = []
        for rank in range(num_workers):
            before = current_rss_mib()
            wiring = first
            if rank > 0:  # rank 0's KV-event overlay is every rank's: one reading of the files
                wiring = load_wiring(file, *overlays, _rank_overlay(rank, num_workers), *same)
            assemblies.append(stack.enter_context(build(wiring)))
            if cap_workers and rank == 1:  # the first one also paid for imports
                check_offline_workers(num_workers, 2, max(current_rss_mib() - before, 0.5))
        fleet = OfflineFleet(
            assemblies,
            workload,
            policy,
            found,
            progress,
            settings,
            admission=admission,
            replay=replay,
            record=record,
            decode_runs=decode_runs,
        )
        setup = time.perf_counter() - started
        summary = fleet.run()
        summary.setup_seconds = setup
        return summary


def _first_wiring(
    file: str | os.PathLike,
    overlays: Sequence[str | os.PathLike | dict],
    num_workers: int,
    kv_events: dict,
    count_outputs: bool,
) -> tuple[list[str | os.PathLike | dict], Wiring, list[dict]]:
    """Rank 0's wiring as ``worker_wiring`` gives it (its publisher on the worker's clock, see
    ``_events_overlay``), the overlays every rank takes (the given ones, plus
    ``_count_outputs``'s when ``count_outputs``) and the KV-event overlay every rank takes
    after its rank's (none when events are off); read in the same two readings of the
    files."""
    wiring = load_wiring(file, *overlays, _rank_overlay(0, num_workers))
    counting = _count_outputs(wiring) if count_outputs else None
    overlays = [*overlays] if counting is None else [*overlays, counting]
    found = kv_events_config(wiring)
    if found is None:
        if counting is not None:
            wiring = load_wiring(file, *overlays, _rank_overlay(0, num_workers))
        return overlays, wiring, []
    name, config = found
    merged = {**msgspec.structs.asdict(config), **kv_events}
    events_overlay = _events_overlay(wiring, name, merged)
    wiring = load_wiring(file, *overlays, _rank_overlay(0, num_workers), events_overlay)
    return overlays, wiring, [events_overlay]


def _events_overlay(wiring: Wiring, name: str, config: dict) -> dict:
    """An overlay giving component ``name`` (the KV-event publisher) the KV-event ``config``
    and, unless the wiring gives it a clock, the model runner's: a batch is then stamped with
    the worker's simulated time when the step that made it ended, and two replays of the same
    workload publish the same bytes (the publisher's own default is the wall clock)."""
    args: dict = {"kv_events_config": config}
    if "now" not in wiring.components[name].args and "model_runner" in wiring.components:
        args["now"] = call("model_runner.now")
    return {"components": {name: {"args": args}}}


def _count_outputs(wiring: Wiring) -> dict | None:
    """An overlay that has each ``output_tally`` sender that sets no ``encode`` count
    without encoding (it can then count runs of decode steps at once), or None."""
    names = [
        name
        for name, spec in wiring.components.items()
        if spec.type == "output_tally" and "encode" not in spec.args
    ]
    if not names:
        return None
    return {"components": {name: {"args": {"encode": False}} for name in names}}


def _queue_events(endpoint: str) -> dict:
    return {"publisher": "queue", "endpoint": endpoint, "replay_endpoint": None}
