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
(the default); on the wall clock every step would also take its time. (Over 300 lines: the
two ways of stepping share the loop's state; what the router is told is in ``router_news``.)
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from schedkit.assembly.container import Assembly, build
from schedkit.assembly.loading import load_wiring
from schedkit.assembly.wiring import Wiring, WiringError
from schedkit.core.schedule_batch import Req
from schedkit.fleet.admission import (
    AdmissionLimits,
    Dispatcher,
    Outcome,
    describe_admission,
    route_by,
)
from schedkit.fleet.capacity import check_offline_workers, current_rss_mib
from schedkit.fleet.events import attach
from schedkit.fleet.pool import pool_pages
from schedkit.fleet.records import RecordRequest
from schedkit.fleet.router_news import RouterNews
from schedkit.fleet.summary import FleetSummary, WorkerTotals, fleet_summary, router_figures
from schedkit.kv_events import KvEventsConfig
from schedkit.kv_events.structs import get_profile
from schedkit.router import Router, make_policy
from schedkit.sim.driver import Stepper, peak_rss_mb
from schedkit.workloads.arrivals import PendingArrivals
from schedkit.workloads.traces import TraceWorkload
from schedkit.workloads.workload import GeneratedWorkload, StaticWorkload, Workload

__all__ = ["OfflineFleet", "kv_events_config", "run_offline", "worker_wiring"]

_runs = itertools.count()
# Steps whose news may wait for the router before it is given them (bounds the backlog).
_MAX_BACKLOG = 1 << 14
# Simulated seconds that workers run ahead of the one furthest behind between two arrivals.
_HORIZON = 1.0
# The collector's first-generation threshold during a replay (Python's default is 700): the
# replay allocates many small containers (the router's index keeps a dict per page), and
# collecting every 700 of them took ~14% of a long replay's CPU time; restored afterwards.
_GC_ALLOCATIONS = 20_000
# Workloads whose requests have no follow-ups (a request's end brings no new arrival).
_NO_FOLLOW_UPS = (TraceWorkload, StaticWorkload, GeneratedWorkload)


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
    overlays, first = _first_wiring(
        file, overlays, num_workers, _queue_events(endpoint), count_outputs=decode_runs
    )
    found = kv_events_config(first)
    if found is None and uses_prefix:
        raise WiringError(
            f"{Path(file)}: routing by prefix needs the workers' KV events; give the "
            "kv_events_publisher a kv_events_config"
        )
    same = []
    if found is not None:
        name, config = found
        config_args = {"kv_events_config": msgspec.structs.asdict(config)}
        same = [{"components": {name: {"args": config_args}}}]
    with contextlib.ExitStack() as stack:
        started = time.perf_counter()
        assemblies = []
        for rank in range(num_workers):
            before = current_rss_mib()
            wiring = first
            if rank > 0:  # rank 0's KV-event config is every rank's: one reading of the files
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
) -> tuple[list[str | os.PathLike | dict], Wiring]:
    """Rank 0's wiring as ``worker_wiring`` gives it, and the overlays every rank takes: the
    given ones, plus ``_count_outputs``'s when ``count_outputs`` (read in the same two
    readings of the files)."""
    wiring = load_wiring(file, *overlays, _rank_overlay(0, num_workers))
    counting = _count_outputs(wiring) if count_outputs else None
    overlays = [*overlays] if counting is None else [*overlays, counting]
    found = kv_events_config(wiring)
    if found is None:
        if counting is not None:
            wiring = load_wiring(file, *overlays, _rank_overlay(0, num_workers))
        return overlays, wiring
    name, config = found
    merged = {**msgspec.structs.asdict(config), **kv_events}
    events_overlay = {"components": {name: {"args": {"kv_events_config": merged}}}}
    return overlays, load_wiring(file, *overlays, _rank_overlay(0, num_workers), events_overlay)


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


class OfflineFleet:
    """The discrete-event loop of one offline fleet run over built ``assemblies`` (worker
    ``r`` is DP rank ``r``). ``events``: the KV-event component's name and config (None when
    events are off); the router's ``KvIndex`` is fed from each worker's queue publisher."""

    def __init__(
        self,
        assemblies: Sequence[Assembly],
        workload: Workload,
        policy: str,
        events: tuple[str, KvEventsConfig] | None,
        progress: Callable[[int, float], None] | None = None,
        settings: Mapping[str, float] | None = None,
        *,
        admission: AdmissionLimits | None = None,
        replay: str = "open loop",
        record: RecordRequest | None = None,
        decode_runs: bool = True,
    ) -> None:
        self.assemblies = assemblies
        self.decode_runs = decode_runs
        self.workload = workload
        self.policy = policy
        self.progress = progress
        self.admission = admission or AdmissionLimits()
        self.replay = replay
        self.record = record
        self.steppers = [Stepper(a) for a in assemblies]
        n = len(assemblies)
        self.routed = [0] * n
        self.input_tokens = [0] * n
        self.step_wall = [0.0] * n
        self.ended = 0
        self.now = 0.0
        self._pending: PendingArrivals | None = None
        channels, decode = [], None
        page_size = 1
        if events is not None:
            name, config = events
            publishers = [a[name] for a in assemblies]
            channels = [attach(p.endpoint) for p in publishers]
            decode = get_profile(config.profile).decode
            page_size = publishers[0].page_size
        steppers = self.steppers
        self.router = Router(
            range(n), page_size, make_policy(policy, **(settings or {})), clock=lambda: self.now
        )
        if events is not None:
            for rank, (assembly, publisher) in enumerate(zip(assemblies, publishers, strict=True)):
                self.router.index.set_capacity(rank, pool_pages(assembly, publisher))
        self.news = RouterNews(assemblies, self.router, channels, decode)
        self._busy: list[tuple[float, int]] = []  # (clock, rank) of each worker in flight
        self._queued = [False] * n  # whether the rank is in _busy
        self.dispatcher = Dispatcher(
            self.admission,
            n,
            live_ranks=lambda: self.router.ranks,
            route=route_by(lambda: self.router),
            deliver=self._deliver,
            abort=lambda rank, req: steppers[rank].scheduler.abort_request(req.rid),
            closed=self._closed,
        )

    def _take_events(self, rank: int) -> None:
        """Apply the KV events worker ``rank`` published and nobody took yet, now."""
        self.news.take_events(rank)

    def _deliver(self, rank: int, req: Req) -> bool:
        """Hand ``req`` to worker ``rank`` (its ``arrival_time`` still seconds from the start:
        the stepper puts it on the worker's clock)."""
        self.routed[rank] += 1
        stepper = self.steppers[rank]
        stepper.submit(req.arrival_time, req)
        self.news.routed(rank, req.rid)
        if not self._queued[rank]:
            self._queued[rank] = True
            heapq.heappush(self._busy, (stepper.elapsed(), rank))
        return True

    def _closed(self, req: Req, rank: int | None, outcome: Outcome) -> None:
        """A request the dispatcher ended (refused or timed out at the router or a worker's
        door): it never reached a worker's clock. One refused at a worker's door counts as
        routed there, as a live worker's refusal does."""
        if rank is not None:
            self.routed[rank] += 1
            self.router.finished(req.rid)
        self._end(req, rank, outcome, self.now, start=0.0)

    def _end(self, req: Req, rank: int | None, outcome: Outcome, now: float, start: float) -> None:
        if self.record is not None:
            self.record(req, rank, outcome, start)
        self._pending.finished(req, now)
        self.ended += 1
        if self.progress is not None:
            self.progress(self.ended, now)

    def _worker_ended(self, rank: int, req: Req, now: float) -> None:
        outcome = self.dispatcher.ended(req)
        if outcome == "done":
            self.input_tokens[rank] += len(req.origin_input_ids)
        self._end(req, rank, outcome, now, start=self.steppers[rank].start)

    def run(self) -> FleetSummary:
        """Run the workload to the end (or Ctrl-C) and summarise it."""
        steppers, dispatcher = self.steppers, self.dispatcher
        pending = self._pending = PendingArrivals(self.workload)
        busy = self._busy
        wall_start = time.perf_counter()
        interrupted = False
        pump_at = math.inf
        # Whether a request's end can only matter to the router at the next arrival or
        # timeout: no follow-up requests, no router queue that an end would pump.
        independent = type(self.workload) in _NO_FOLLOW_UPS and not dispatcher.has_router_queue
        thresholds = gc.get_threshold()
        if 0 < thresholds[0] < _GC_ALLOCATIONS:
            gc.set_threshold(_GC_ALLOCATIONS, *thresholds[1:])
        try:
            while True:
                due = min(pending.next_time(), dispatcher.next_deadline())
                if dispatcher.pump_due:
                    due = min(due, pump_at)
                if not busy and due == math.inf:
                    break
                if busy and busy[0][0] < due:
                    if independent:
                        self._run_ahead(due)
                        continue
                    _, rank = heapq.heappop(busy)
                    if self._run_behind(rank, due) and dispatcher.pump_due:
                        pump_at = min(pump_at, steppers[rank].elapsed())
                    continue
                self.now = due
                self.news.catch_up(due)
                for rank, stepper in enumerate(steppers):
                    if not self._queued[rank]:
                        stepper.wait_until(due)
                dispatcher.expire(due)
                for arrival in pending.due(due):
                    arrival.req.arrival_time = arrival.time
                    dispatcher.arrive(arrival.req)
                dispatcher.pump()
                pump_at = math.inf
            self.news.catch_up(math.inf)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            gc.set_threshold(*thresholds)
            for stepper in steppers:
                stepper.close()
        return self._summary(time.perf_counter() - wall_start, interrupted)

    def _run_ahead(self, due: float) -> None:
        """Step every busy worker whose clock is behind a horizon (``due`` seconds, or
        ``_HORIZON`` past the one furthest behind if sooner) up to it, one worker after the
        other, then hand over the requests that ended in the order of the steps that ended
        them (by start time, then rank), as ``_run_behind`` would have met them. Only when
        requests ending change nothing before ``due`` (see ``run``)."""
        busy, steppers, after_step = self._busy, self.steppers, self.news.after_step
        floor = busy[0][0]
        if self.news.backlog > _MAX_BACKLOG:
            self.news.catch_up(floor)
        horizon = min(due, floor + _HORIZON)
        behind = []
        while busy and busy[0][0] < horizon:
            behind.append(heapq.heappop(busy)[1])
        ended = []
        after_run, runs = self.news.after_run, self.decode_runs
        for rank in behind:
            self._queued[rank] = False
            stepper = steppers[rank]
            elapsed, step, run_decode = stepper.elapsed, stepper.step, stepper.run_decode
            step_wall = 0.0
            clock = elapsed()
            while clock < horizon:
                start = clock
                started = time.perf_counter()
                run = run_decode(horizon) if runs else None
                if run is not None:
                    step_wall += time.perf_counter() - started
                    ends, taken = run
                    clock = ends[-1]
                    after_run(rank, start, ends, taken)
                    continue
                _, finished = step()
                step_wall += time.perf_counter() - started
                clock = elapsed()
                after_step(rank, finished, start, clock)
                if finished:
                    ended.append((start, rank, clock, finished))
                    if not stepper.inflight:
                        break
            self.step_wall[rank] += step_wall
            if stepper.inflight:
                self._queued[rank] = True
                heapq.heappush(busy, (clock, rank))
        ended.sort(key=lambda e: (e[0], e[1]))  # stable: a worker's steps stay in order
        for _, rank, end, finished in ended:
            for req in finished:
                self._worker_ended(rank, req, end)

    def _run_behind(self, rank: int, due: float) -> bool:
        """Step worker ``rank``, the busy worker furthest behind, for as long as it stays so
        and its clock is before ``due`` (seconds), stopping after a step that ends requests:
        what follows may move ``due``. True if requests ended."""
        stepper, busy = self.steppers[rank], self._busy
        elapsed, step, after_step = stepper.elapsed, stepper.step, self.news.after_step
        run_decode = stepper.run_decode if self.decode_runs else None
        step_wall = 0.0
        ended = False
        self._queued[rank] = False
        clock = elapsed()
        while True:
            if self.news.backlog > _MAX_BACKLOG:
                self.news.catch_up(clock)
            start = clock
            started = time.perf_counter()
            # Steps run together stop where this loop would: at ``due`` or at the clock of
            # the next busy worker (a tie there is left to the check below).
            run = run_decode(min(due, busy[0][0]) if busy else due) if run_decode else None
            if run is not None:
                step_wall += time.perf_counter() - started
                ends, taken = run
                clock = ends[-1]
                self.news.after_run(rank, start, ends, taken)
                if clock >= due or (busy and busy[0] < (clock, rank)):
                    break
                continue
            _, finished = step()
            step_wall += time.perf_counter() - started
            clock = elapsed()
            after_step(rank, finished, start, clock)
            if finished:
                for req in finished:
                    self._worker_ended(rank, req, clock)
                ended = True
                break
            # The next step of the busy worker furthest behind (the lowest rank on a tie).
            if clock >= due or (busy and busy[0] < (clock, rank)):
                break
        self.step_wall[rank] += step_wall
        if stepper.inflight and not self._queued[rank]:
            self._queued[rank] = True
            heapq.heappush(busy, (clock, rank))
        return ended

    def _summary(self, wall: float, interrupted: bool) -> FleetSummary:
        d = self.dispatcher
        rss = peak_rss_mb()  # one process: every worker's figure is the fleet's
        workers = []
        for rank, stepper in enumerate(self.steppers):
            scheduler = stepper.assembly["scheduler"]
            workers.append(
                WorkerTotals(
                    tally=stepper.tally,
                    routed=self.routed[rank],
                    refused=d.refused[rank],
                    timed_out=d.timed_out[rank],
                    # A timed-out request was aborted on its worker: its tally counts it failed.
                    failed=stepper.tally.failed - d.timed_out[rank],
                    input_tokens=self.input_tokens[rank],
                    cached_tokens=scheduler.prefill_tokens_cached,
                    computed_tokens=scheduler.prefill_tokens_computed,
                    peak_held_requests=d.peak_held_requests[rank],
                    peak_held_tokens=d.peak_held_tokens[rank],
                    wall_seconds=self.step_wall[rank],
                    peak_rss_mib=rss,
                )
            )
        simulated = max(s.elapsed() for s in self.steppers)
        return fleet_summary(
            policy=self.policy,
            mode="offline",
            replay=self.replay,
            admission=describe_admission(self.admission),
            workers=workers,
            router=router_figures(d),
            run_seconds=simulated,
            simulated_seconds=simulated,
            wall_seconds=wall,
            interrupted=interrupted,
        )
