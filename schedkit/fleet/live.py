"""A live fleet: N scheduler processes on the wall clock behind a router in this process.

The workers are started, watched and stopped by ``schedkit.fleet.workers.LiveWorkers``.
The router follows every worker's KV events (``KvRouter``: one subscriber per worker,
recovering through replay), routes each request through the admission control
(``schedkit.fleet.admission``) by prefix overlap and load (its requests in flight on each
worker), sends it on a DEALER connected to that worker's ``zmq_server`` (through the
worker's outbox here while that socket's queue is full) and reads the outputs back. A
worker's refusal comes back as an ``ErrorReply`` for the request: counted as that worker's
refusal, or, with a router queue, the request waits there again. A worker whose process
exits, or that sends no heartbeat for ``heartbeat_timeout`` seconds (1 s by default; it
beats every 0.2 s from a thread of its own), is taken out of the routing and its requests in
flight fail (or, with a router queue, those with no first token wait there again). A message
from a worker that does not decode is counted (``bad_messages``) and logged; a worker that
sends ``max_bad_messages`` of them in a row is taken out as broken. Every 0.5 s each worker
is asked for its loads, which give its running and queued requests over time.

Latencies are taken as the outputs arrive, on the router's clock. A message carrying ``k``
tokens that arrives ``gap`` seconds after the request's previous one gives ``k`` inter-token
latencies of ``gap / k`` (as SGLang's ``bench_serving`` counts a chunk of several tokens);
the first message's ``k`` tokens start the request's TTFT and give ``k - 1`` latencies of 0
(they arrived with the first). So a request of ``n`` tokens has ``n - 1`` ITL samples summing
to its last token's time minus its first's, as in a single-scheduler run (one sample per
token after the first, ``schedkit.workloads.samples.Tally``), and its TPOT is their mean.
(``bench_serving`` leaves the first chunk's extra tokens out of its ITL samples.)

Sending is in ``live_sending``, receiving in ``live_receiving``, watching the workers and
taking one out in ``live_health``, ending requests and summarising the run in ``live_totals``
(each mixed into ``LiveFleet``); they share the bookkeeping of requests in flight kept here.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import zmq

from schedkit.core.schedule_batch import Req
from schedkit.fleet.admission import AdmissionLimits, Dispatcher, route_by
from schedkit.fleet.launch import LAUNCHERS, WorkerStartError
from schedkit.fleet.live_health import LiveHealth
from schedkit.fleet.live_receiving import LiveReceiving
from schedkit.fleet.live_sending import LiveSending
from schedkit.fleet.live_totals import LiveTotals
from schedkit.fleet.records import RecordRequest
from schedkit.fleet.summary import FleetSummary
from schedkit.fleet.workers import LiveWorkers
from schedkit.router import KvRouter, Router, make_policy
from schedkit.sim.driver import Tally
from schedkit.workloads.arrivals import PendingArrivals
from schedkit.workloads.workload import Workload

__all__ = ["LAUNCHERS", "LiveFleet", "WorkerStartError"]


class LiveFleet(LiveSending, LiveReceiving, LiveHealth, LiveTotals, LiveWorkers):
    """Start with ``start()`` (or ``with``), drive a workload with ``run()``, ``close()``."""

    def __init__(
        self,
        file: str | os.PathLike,
        num_workers: int,
        policy: str = "kv",
        *,
        overlays: Sequence[str | os.PathLike | Mapping] = (),
        settings: Mapping[str, float] | None = None,
        launcher: str = "process",
        heartbeat_interval: float = 0.2,
        heartbeat_timeout: float = 1.0,
        load_interval: float = 0.5,
        ready_timeout: float = 120.0,
        grace: float = 2.0,
        max_bad_messages: int = 10,
        admission: AdmissionLimits | None = None,
        replay: str = "open loop",
        record: RecordRequest | None = None,
        cap_workers: bool = True,
        worker_http: Mapping | None = None,
    ) -> None:
        self.settings = dict(settings or {})
        make_policy(policy, **self.settings)
        self.policy = policy
        limits = (admission or AdmissionLimits()).worker
        super().__init__(
            file,
            num_workers,
            overlays=overlays,
            launcher=launcher,
            heartbeat_interval=heartbeat_interval,
            heartbeat_timeout=heartbeat_timeout,
            ready_timeout=ready_timeout,
            grace=grace,
            max_requests=limits.max_requests,
            max_tokens=limits.max_tokens,
            cap_workers=cap_workers,
            worker_http=worker_http,
        )
        self.load_interval = load_interval
        self.admission = admission or AdmissionLimits()
        self.replay, self.record = replay, record
        self.max_bad_messages = max_bad_messages
        self.bad_messages = [0] * num_workers  # messages that did not decode, per worker
        self._bad_in_a_row = [0] * num_workers
        self.router: Router | None = None
        self._inflight: dict[str, tuple[int, Req]] = {}
        self._aborting: set[str] = set()  # timed out here; the worker's answer is not awaited
        self._load = [0] * num_workers
        self._tallies = [Tally() for _ in range(num_workers)]
        self._failed = [0] * num_workers
        self._input_tokens = [0] * num_workers
        self._doomed: dict[int, str] = {}  # workers to take out once the dispatcher returns
        # Requests routed to a worker whose socket queue was full, in order (packed).
        self._outboxes: list[deque[Req]] = [deque() for _ in range(num_workers)]
        # When each request in flight left for its worker, seconds from the start.
        self._sent_at: dict[str, float] = {}
        self.dispatcher = Dispatcher(
            self.admission,
            num_workers,
            live_ranks=lambda: self.router.ranks,
            route=route_by(lambda: self.router),
            deliver=self._deliver,
            abort=self._abort,
            closed=self._dispatcher_closed,
            check_worker_limits=False,  # each worker refuses what it cannot hold itself
        )
        self._on_route: Callable[[LiveFleet, int], None] | None = None
        self._progress: Callable[[int, float], None] | None = None
        self._ended = 0
        self._pending: PendingArrivals | None = None
        self._start_time = self._next_check = self._next_load = 0.0
        self.routed = [0] * num_workers
        # Sockets of a subclass polled with the workers' (socket -> what reads it).
        self._socket_handlers: dict[zmq.Socket, Callable[[], None]] = {}

    def _start(self) -> None:
        """Start the workers, then the router over them."""
        ready = self._start_workers()
        first = ready[0]
        page_size = first["page_size"] or 1
        policy = make_policy(self.policy, **self.settings)
        if all(r["kv_events"] for r in ready.values()):
            endpoints = {rank: (r["kv_events"], r["replay"]) for rank, r in ready.items()}
            self.router = KvRouter(
                endpoints,
                page_size,
                topic=first["topic"],
                profile=first["profile"],
                policy=policy,
                capacity={rank: r["pool_pages"] for rank, r in ready.items()},
            )
        elif policy.uses_prefix:
            raise WorkerStartError(
                f"routing by prefix needs the workers' KV events; give the wiring's "
                f"kv_events_publisher a kv_events_config ({self.file})"
            )
        else:
            self.router = Router(range(self.num_workers), page_size, policy)

    # ---- driving a workload -------------------------------------------------------------

    def run(
        self,
        workload: Workload,
        on_route: Callable[[LiveFleet, int], None] | None = None,
        progress: Callable[[int, float], None] | None = None,
    ) -> FleetSummary:
        """Send ``workload`` through the fleet on the wall clock until every request ended,
        stop the workers and summarise. ``on_route(fleet, n)`` is called after the n-th
        request is sent to a worker; ``progress(ended, seconds)`` after each request ends."""
        pending = self._pending = PendingArrivals(workload)
        self._progress = progress
        dispatcher = self.dispatcher
        self._on_route = on_route
        start = self._begin()
        interrupted = False
        try:
            while pending or self._inflight or dispatcher.queue:
                now = time.monotonic()
                elapsed = now - start
                dispatcher.expire(elapsed)
                for arrival in pending.due(elapsed):
                    arrival.req.arrival_time = arrival.time
                    dispatcher.arrive(arrival.req)
                wait = min(pending.next_time() - elapsed, self._housekeep(now, elapsed))
                self._poll(wait)
        except KeyboardInterrupt:
            interrupted = True
        wall = time.monotonic() - start
        self.close()
        return self._summary(wall, interrupted)

    def _begin(self) -> float:
        """Start following the workers' reports and the clock; returns the start time."""
        start = self._start_time = time.monotonic()
        self._poller.register(self._report, zmq.POLLIN)
        self._last_seen = [start] * self.num_workers
        self._next_check = self._next_load = start
        return start

    def _housekeep(self, now: float, elapsed: float) -> float:
        """The router queue, workers to take out, heartbeats and load queries; returns how
        long the loop may wait for sockets before the next call (seconds)."""
        dispatcher = self.dispatcher
        if dispatcher.queue:
            dispatcher.pump()
        self._take_out_doomed()
        if now >= self._next_check:
            sample_loads = now >= self._next_load
            self._check_workers(now, sample_loads=sample_loads)
            if sample_loads:
                self._next_load = now + self.load_interval
            self._next_check = now + min(self.heartbeat_interval, self.heartbeat_timeout / 4)
        return min(dispatcher.next_deadline() - elapsed, self._next_check - now, 0.05)

    def _poll(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for the sockets and take in what came."""
        start = self._start_time
        for sock, events in self._poller.poll(max(0, int(wait * 1000))):
            if sock is self._report:
                self._take_reports()
            elif sock in self._sentinels:
                self._mark_dead(self._sentinels[sock], "its process exited")
            elif sock in self._socket_handlers:
                self._socket_handlers[sock]()
            else:
                rank = self._dealers.index(sock)
                if events & zmq.POLLOUT and self.alive[rank]:
                    self._flush(rank)
                while self.alive[rank] and sock.poll(0):
                    self._receive(rank, sock.recv(), time.monotonic() - start)
        if isinstance(self.router, KvRouter):
            self.router.poll(0)

    def _elapsed(self) -> float:
        return time.monotonic() - self._start_time

    # ---- stopping and summarising ---------------------------------------------------------

    def close(self) -> None:
        """Stop the workers (see ``LiveWorkers.close``) and close the router's sockets."""
        super().close()
        if isinstance(self.router, KvRouter):
            self.router.close()
