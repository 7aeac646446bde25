"""A live fleet: N scheduler processes on the wall clock behind a router in this process.

Each worker (``schedkit.fleet.worker``) is its own process (multiprocessing spawn context,
or a Ray actor with ``launcher="ray"``) with its own request endpoint and KV-event publisher
on free loopback ports. The router follows every worker's KV events (``KvRouter``: one
subscriber per worker, recovering through replay), routes each request by prefix overlap
and load (its requests in flight on each worker), sends it on a DEALER connected to that
worker's ``zmq_server`` and reads the outputs back. A worker whose process exits, or that
answers no ``get_loads`` heartbeat for ``heartbeat_timeout`` seconds, is taken out of the
routing and its requests in flight are reported failed (a worker's exit is seen at once:
its launcher's sentinel, for a process or a Ray actor, is polled with the sockets). A
message from a worker that does not decode is counted (``bad_messages``) and logged; a
worker that sends ``max_bad_messages`` of them in a row is taken out as broken.

Latencies are taken as the outputs arrive, on the router's clock. A message carrying ``k``
tokens that arrives ``gap`` seconds after the request's previous one gives ``k`` inter-token
latencies of ``gap / k`` (as SGLang's ``bench_serving`` counts a chunk of several tokens);
the first message's ``k`` tokens start the request's TTFT and give ``k - 1`` latencies of 0
(they arrived with the first). So a request of ``n`` tokens has ``n - 1`` ITL samples summing
to its last token's time minus its first's, as in a single-scheduler run (one sample per
token after the first, ``schedkit.workloads.samples.Tally``), and its TPOT is their mean.
(``bench_serving`` leaves the first chunk's extra tokens out of its ITL samples.)

(Longer than 300 lines: starting, driving and stopping the workers share the sockets and
the bookkeeping of requests in flight.)
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog
import zmq

from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    ControlReq,
    ErrorReply,
    GenerateReqInput,
    SamplingParamsInput,
    decode_server_message,
    encode,
)
from schedkit.core.schedule_batch import FinishAbort, Req
from schedkit.fleet.launch import LAUNCHERS, WorkerStartError, exit_reason
from schedkit.fleet.summary import FleetSummary, fleet_summary
from schedkit.fleet.worker import LOOPBACK_ANY_PORT, WorkerSpec
from schedkit.router import KvRouter, Router, make_policy
from schedkit.sim.driver import Tally
from schedkit.workloads.arrivals import PendingArrivals
from schedkit.workloads.workload import Workload

__all__ = ["LAUNCHERS", "LiveFleet", "WorkerStartError"]

log = structlog.get_logger(__name__)


def _bind(context: zmq.Context, kind: int) -> tuple[zmq.Socket, str]:
    sock = context.socket(kind)
    sock.bind(LOOPBACK_ANY_PORT)
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


class LiveFleet:
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
        heartbeat_interval: float = 0.5,
        heartbeat_timeout: float = 5.0,
        ready_timeout: float = 120.0,
        grace: float = 2.0,
        max_bad_messages: int = 10,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"a fleet needs at least one worker, got {num_workers}")
        if launcher not in LAUNCHERS:
            raise ValueError(f"unknown launcher {launcher!r}; valid: {', '.join(LAUNCHERS)}")
        self.settings = dict(settings or {})
        make_policy(policy, **self.settings)
        # Absolute paths: a worker may run in another working directory (a Ray actor).
        self.file, self.num_workers, self.policy = str(Path(file).resolve()), num_workers, policy
        self.overlays = tuple(
            o if isinstance(o, Mapping) else str(Path(o).resolve()) for o in overlays
        )
        self.launcher = launcher
        self.startup_seconds = math.nan  # launching the workers until all were ready
        self.heartbeat_interval, self.heartbeat_timeout = heartbeat_interval, heartbeat_timeout
        self.ready_timeout, self.grace = ready_timeout, grace
        self.max_bad_messages = max_bad_messages
        self.bad_messages = [0] * num_workers  # messages that did not decode, per worker
        self._bad_in_a_row = [0] * num_workers
        self.handles: list[Any] = []
        self.endpoints: dict[int, dict] = {}  # each worker's ready report: pid and endpoints
        self._launcher: Any = None
        self.alive = [True] * num_workers
        self.deaths: dict[int, str] = {}
        self.router: Router | None = None
        self.stats: dict[int, dict] = {}
        self._context = zmq.Context()
        self._report, self._report_endpoint = _bind(self._context, zmq.PULL)
        self._stop, self._stop_endpoint = _bind(self._context, zmq.PUB)
        self._dealers: list[zmq.Socket] = []
        self._decode_report = msgspec.msgpack.Decoder(dict).decode
        self._inflight: dict[str, tuple[int, Req]] = {}
        self._load = [0] * num_workers
        self._tallies = [Tally() for _ in range(num_workers)]
        self._unrouted = Tally()
        self._poller = zmq.Poller()
        self._sentinels: dict[int, int] = {}
        self.routed = [0] * num_workers
        self._last_seen = [0.0] * num_workers
        self._closed = False

    def __enter__(self) -> LiveFleet:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Launch the workers, wait until each is ready and connect the router to them;
        on failure whatever started is stopped again."""
        started = time.monotonic()
        try:
            self._start()
            self.startup_seconds = time.monotonic() - started
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        self._launcher = LAUNCHERS[self.launcher]()
        for rank in range(self.num_workers):
            spec = WorkerSpec(
                self.file,
                self.overlays,
                rank,
                self.num_workers,
                self._report_endpoint,
                self._stop_endpoint,
                parent_pid=os.getpid(),
                grace=self.grace,
            )
            self.handles.append(self._launcher.launch(spec))
        ready = self.endpoints = self._wait_ready()
        for rank in range(self.num_workers):
            dealer = self._context.socket(zmq.DEALER)
            dealer.connect(ready[rank]["requests"])
            self._dealers.append(dealer)
            self._poller.register(dealer, zmq.POLLIN)
            sentinel = self.handles[rank].sentinel  # readable once the worker has exited
            self._poller.register(sentinel, zmq.POLLIN)
            self._sentinels[sentinel] = rank
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
                load=self._load.__getitem__,
            )
        elif policy.uses_prefix:
            raise WorkerStartError(
                f"routing by prefix needs the workers' KV events; give the wiring's "
                f"kv_events_publisher a kv_events_config ({self.file})"
            )
        else:
            self.router = Router(range(self.num_workers), page_size, policy, self._load.__getitem__)

    def _wait_ready(self) -> dict[int, dict]:
        ready: dict[int, dict] = {}
        deadline = time.monotonic() + self.ready_timeout
        while len(ready) < self.num_workers:
            if self._report.poll(100):
                self._take_ready(ready)
            gone = [r for r, h in enumerate(self.handles) if r not in ready and not h.is_alive()]
            if gone:
                while self._report.poll(500):  # the report it sent before exiting, if any
                    self._take_ready(ready)
                why = exit_reason(self.handles[gone[0]])
                raise WorkerStartError(f"worker {gone[0]} exited before it was ready ({why})")
            if time.monotonic() > deadline:
                raise WorkerStartError(f"workers not ready after {self.ready_timeout:g} s")
        now = time.monotonic()
        self._last_seen = [now] * self.num_workers
        return ready

    def _take_ready(self, ready: dict[int, dict]) -> None:
        """One start-up report: a worker's endpoints into ``ready``, or its error raised."""
        msg = self._decode_report(self._report.recv())
        if "error" in msg:
            raise WorkerStartError(f"worker {msg['rank']}: {msg['error']}")
        ready[msg["rank"]] = msg["ready"]

    def kill(self, rank: int) -> None:
        """Kill worker ``rank`` outright, its process or its Ray actor (as a crash would)."""
        self.handles[rank].kill()

    # ---- driving a workload -------------------------------------------------------------

    def run(
        self,
        workload: Workload,
        on_route: Callable[[LiveFleet, int], None] | None = None,
        progress: Callable[[int, float], None] | None = None,
    ) -> FleetSummary:
        """Send ``workload`` through the fleet on the wall clock until every request
        finished or failed, stop the workers and summarise. ``on_route(fleet, n)`` is called
        after the n-th request is sent; ``progress(finished, seconds)`` after requests
        finish."""
        pending = PendingArrivals(workload)
        start = time.monotonic()
        next_heartbeat, sent, interrupted, done = start, 0, False, 0
        try:
            while pending or self._inflight:
                now = time.monotonic()
                elapsed = now - start
                for arrival in pending.due(elapsed):
                    self._send(arrival.time, arrival.req)
                    sent += 1
                    if on_route is not None:
                        on_route(self, sent)
                if now >= next_heartbeat:
                    self._check_workers(now)
                    next_heartbeat = now + self.heartbeat_interval
                wait = min(pending.next_time() - elapsed, next_heartbeat - now, 0.05)
                for sock, _ in self._poller.poll(max(0, int(wait * 1000))):
                    if sock in self._sentinels:
                        self._mark_dead(self._sentinels[sock], "its process exited")
                        continue
                    rank = self._dealers.index(sock)
                    while self.alive[rank] and sock.poll(0):
                        received = time.monotonic() - start
                        finished = self._receive(rank, sock.recv(), received)
                        for req in finished:
                            pending.finished(req, received)
                        if finished and progress is not None:
                            done += len(finished)
                            progress(done, received)
                if isinstance(self.router, KvRouter):
                    self.router.poll(0)
        except KeyboardInterrupt:
            interrupted = True
        wall = time.monotonic() - start
        self.close()
        return self._summary(wall, interrupted)

    def _send(self, at: float, req: Req) -> None:
        req.arrival_time = at
        try:
            rank = self.router.route(req.origin_input_ids).rank
        except LookupError:
            self._fail(req, "no live worker to route to")
            return
        params = req.sampling_params
        message = GenerateReqInput(
            rid=req.rid,
            input_ids=req.origin_input_ids,
            sampling_params=SamplingParamsInput(
                max_new_tokens=params.max_new_tokens,
                stop_token_ids=list(params.stop_token_ids),
                ignore_eos=params.ignore_eos,
                stream=True,
                stream_interval=params.stream_interval,
            ),
        )
        try:
            self._dealers[rank].send(encode(message), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self._mark_dead(rank, f"request socket error: {exc.strerror}")
            self._fail(req, f"worker {rank} could not take it")
            return
        self._inflight[req.rid] = (rank, req)
        self._load[rank] += 1
        self.routed[rank] += 1

    def _receive(self, rank: int, payload: bytes, now: float) -> list[Req]:
        """Take in one message from worker ``rank``, ``now`` seconds from the start; returns
        the requests it finished. Outputs for a request routed to another worker are logged
        and ignored."""
        try:
            msg = decode_server_message(payload)
            if isinstance(msg, BatchTokenIDOutput):
                _check_columns(msg)
        except (msgspec.DecodeError, RecursionError, ValueError) as exc:
            self._bad_message(rank, exc)
            return []
        self._last_seen[rank] = time.monotonic()
        self._bad_in_a_row[rank] = 0
        finished = []
        if isinstance(msg, BatchTokenIDOutput):
            for rid, tokens, reason in zip(
                msg.rids, msg.output_ids, msg.finished_reasons, strict=True
            ):
                req = self._routed_to(rank, rid)
                if req is None:
                    continue
                if tokens:
                    last = req.last_token_time
                    if last is None:
                        req.first_token_time = now
                        req.itl.extend([0.0] * (len(tokens) - 1))
                    else:
                        req.itl.extend([(now - last) / len(tokens)] * len(tokens))
                    req.last_token_time = now
                    req.output_ids.extend(tokens)
                if reason is not None:
                    req.finished_reason, req.finish_time = reason, now
                    self._finish(rid)
                    if not isinstance(reason, FinishAbort):
                        finished.append(req)
        elif isinstance(msg, ErrorReply):
            if msg.rid not in self._inflight:  # e.g. a heartbeat it refused
                log.warning("fleet.worker_refused", worker=rank, rid=msg.rid, error=msg.message)
            elif (req := self._routed_to(rank, msg.rid)) is not None:
                req.finished_reason = FinishAbort(message=msg.message)
                self._finish(msg.rid)
        return finished

    def _routed_to(self, rank: int, rid: str) -> Req | None:
        """The request ``rid`` in flight on worker ``rank``; None (logged when it is in
        flight on another worker) otherwise."""
        entry = self._inflight.get(rid)
        if entry is None:
            return None
        owner, req = entry
        if owner != rank:
            log.warning("fleet.output_from_wrong_worker", rid=rid, worker=rank, routed_to=owner)
            return None
        return req

    def _bad_message(self, rank: int, exc: Exception) -> None:
        """Count and log a message from worker ``rank`` that does not decode; take the
        worker out when ``max_bad_messages`` came in a row."""
        self.bad_messages[rank] += 1
        self._bad_in_a_row[rank] += 1
        in_a_row = self._bad_in_a_row[rank]
        log.warning(
            "fleet.bad_worker_message", worker=rank, error=str(exc)[:500], in_a_row=in_a_row
        )
        if in_a_row >= self.max_bad_messages:
            self._mark_dead(
                rank, f"sent {in_a_row} messages in a row that do not decode (last: {exc})"
            )

    def _finish(self, rid: str) -> None:
        rank, req = self._inflight.pop(rid)
        req.finished_output = True
        self._load[rank] -= 1
        self._tallies[rank].add(req)

    def _fail(self, req: Req, why: str) -> None:
        """A request no worker took: failed, in the fleet's figures only."""
        req.finished_reason = FinishAbort(message=why)
        self._unrouted.add(req)

    def _check_workers(self, now: float) -> None:
        """Heartbeats out; a worker that exited or stays silent is taken out."""
        for rank, handle in enumerate(self.handles):
            if not self.alive[rank]:
                continue
            if not handle.is_alive():
                self._mark_dead(rank, "its process exited")
            elif now - self._last_seen[rank] > self.heartbeat_timeout:
                self._mark_dead(rank, f"no heartbeat for {self.heartbeat_timeout:g} s")
            else:
                with contextlib.suppress(zmq.Again):
                    self._dealers[rank].send(encode(ControlReq(type="get_loads")), zmq.NOBLOCK)

    def _mark_dead(self, rank: int, why: str) -> None:
        self.alive[rank] = False
        self.deaths[rank] = why
        self._poller.unregister(self._dealers[rank])
        for sentinel in [fd for fd, owner in self._sentinels.items() if owner == rank]:
            self._poller.unregister(sentinel)
            del self._sentinels[sentinel]
        self.router.remove(rank)
        for rid, (owner, req) in list(self._inflight.items()):
            if owner == rank:
                req.finished_reason = FinishAbort(message=f"worker {rank} died: {why}")
                self._finish(rid)

    # ---- stopping and summarising ---------------------------------------------------------

    def close(self) -> None:
        """Stop the live workers (they drain for ``grace`` s), collect their final figures,
        kill what does not stop and close every socket. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._stop.send(b"stop")
        deadline = time.monotonic() + self.grace + 10.0
        pending = {r for r, h in enumerate(self.handles) if self.alive[r] and h.is_alive()}
        exited: dict[int, float] = {}
        while pending and time.monotonic() < deadline:
            if self._report.poll(100):
                msg = self._decode_report(self._report.recv())
                if "stats" in msg:
                    self.stats[msg["rank"]] = msg["stats"]
                    pending.discard(msg["rank"])
            now = time.monotonic()
            for rank in [r for r in pending if not self.handles[r].is_alive()]:
                if now - exited.setdefault(rank, now) > 1.0:  # its report would be here by now
                    pending.discard(rank)
        for rank, handle in enumerate(self.handles):
            if self.alive[rank]:
                handle.join(timeout=5.0)
            if handle.is_alive():  # dead to the router (e.g. hung) or not stopping
                handle.kill()
                handle.join(timeout=5.0)
        if self._launcher is not None:
            self._launcher.close()
        if isinstance(self.router, KvRouter):
            self.router.close()
        for sock in [*self._dealers, self._report, self._stop]:
            sock.close(linger=0)
        self._context.term()

    def _summary(self, wall: float, interrupted: bool) -> FleetSummary:
        stats = [self.stats.get(rank, {}) for rank in range(self.num_workers)]
        return fleet_summary(
            policy=self.policy,
            mode="live",
            tallies=self._tallies,
            routed=self.routed,
            tokens=[(s.get("cached_tokens", 0), s.get("computed_tokens", 0)) for s in stats],
            walls=[s.get("uptime_seconds", math.nan) for s in stats],
            rss=[s.get("peak_rss_mb", math.nan) for s in stats],
            alive=self.alive,
            simulated_seconds=math.nan,
            wall_seconds=wall,
            interrupted=interrupted,
            unrouted=self._unrouted,
            setup_seconds=self.startup_seconds,
        )


def _check_columns(msg: BatchTokenIDOutput) -> None:
    """ValueError unless the per-request columns the router reads have one entry per rid."""
    lengths = {
        "rids": len(msg.rids),
        "output_ids": len(msg.output_ids),
        "finished_reasons": len(msg.finished_reasons),
    }
    if len(set(lengths.values())) > 1:
        found = ", ".join(f"{name} {n}" for name, n in lengths.items())
        raise ValueError(f"BatchTokenIDOutput columns differ in length ({found}); one per rid")
