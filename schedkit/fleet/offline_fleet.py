"""The discrete-event loop of an offline fleet run (see ``schedkit.fleet.offline``)."""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence

from schedkit.assembly.container import Assembly
from schedkit.core.schedule_batch import Req
from schedkit.fleet.admission import (
    AdmissionLimits,
    Dispatcher,
    Outcome,
    describe_admission,
    route_by,
)
from schedkit.fleet.events import attach
from schedkit.fleet.offline_stepping import OfflineStepping
from schedkit.fleet.pool import pool_pages
from schedkit.fleet.records import RecordRequest
from schedkit.fleet.router_news import RouterNews
from schedkit.fleet.summary import FleetSummary, WorkerTotals, fleet_summary, router_figures
from schedkit.kv_events import KvEventsConfig
from schedkit.router import Router, make_policy
from schedkit.sim.driver import Stepper, peak_rss_mb
from schedkit.workloads.arrivals import PendingArrivals
from schedkit.workloads.traces import TraceWorkload
from schedkit.workloads.workload import GeneratedWorkload, StaticWorkload, Workload

__all__ = ["OfflineFleet"]

# The collector's first-generation threshold during a replay (Python's default is 700): the
# replay allocates many small containers (requests, radix nodes, event structs), none of them
# in cycles that need collecting soon; restored afterwards.
_GC_ALLOCATIONS = 20_000

# Workloads whose requests have no follow-ups (a request's end brings no new arrival).
_NO_FOLLOW_UPS = (TraceWorkload, StaticWorkload, GeneratedWorkload)


class OfflineFleet(OfflineStepping):
    """The discrete-event loop of one offline fleet run over built ``assemblies`` (worker
    ``r`` is DP rank ``r``). ``events``: the KV-event component's name and config (None when
    events are off); the router's ``KvIndex`` is fed from each worker's queue publisher, which
    keeps each batch as the index would read it off the wire (``keep_for_index``)."""

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
        channels = []
        page_size = 1
        if events is not None:
            name, _ = events
            publishers = [a[name] for a in assemblies]
            channels = [attach(p.endpoint) for p in publishers]
            for channel in channels:
                channel.keep_for_index()  # the router's index reads no tokens
            page_size = publishers[0].page_size
        steppers = self.steppers
        self.router = Router(
            range(n), page_size, make_policy(policy, **(settings or {})), clock=lambda: self.now
        )
        if events is not None:
            for rank, (assembly, publisher) in enumerate(zip(assemblies, publishers, strict=True)):
                self.router.index.set_capacity(rank, pool_pages(assembly, publisher))
        self.news = RouterNews(assemblies, self.router, channels)
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
