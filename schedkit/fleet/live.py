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
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog
import zmq

from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    ErrorReply,
    GenerateReqInput,
    SamplingParamsInput,
    decode_server_message,
    encode,
)
from schedkit.core.schedule_batch import FinishAbort, Req
from schedkit.fleet.admission import AdmissionLimits, Dispatcher, Outcome, describe_admission
from schedkit.fleet.capacity import check_live_workers
from schedkit.fleet.launch import LAUNCHERS, WorkerStartError, exit_reason
from schedkit.fleet.records import RecordRequest
from schedkit.fleet.summary import FleetSummary, RouterFigures, WorkerTotals, fleet_summary
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
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"a fleet needs at least one worker, got {num_workers}")
        if cap_workers:
            check_live_workers(num_workers)
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
        self.heartbeat_interval, self.heartbeat_timeout = heartbeat_interval, heartbeat_timeout
        self.load_interval = load_interval
        self.admission = admission or AdmissionLimits()
        self.replay, self.record = replay, record
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
        self._aborting: set[str] = set()  # timed out here; the worker's answer is not awaited
        self._load = [0] * num_workers
        self._tallies = [Tally() for _ in range(num_workers)]
        self._failed = [0] * num_workers
        self._input_tokens = [0] * num_workers
        self._doomed: dict[int, str] = {}  # workers to take out once the dispatcher returns
        # Requests routed to a worker whose socket queue was full, in order (packed).
        self._outboxes: list[deque[Req]] = [deque() for _ in range(num_workers)]
        self.dispatcher = Dispatcher(
            self.admission,
            num_workers,
            live_ranks=lambda: self.router.ranks,
            route=lambda req, ranks: self.router.route(req.origin_input_ids, ranks).rank,
            deliver=self._deliver,
            abort=self._abort,
            closed=self._closed,
            check_worker_limits=False,  # each worker refuses what it cannot hold itself
        )
        self._on_route: Callable[[LiveFleet, int], None] | None = None
        self._pending: PendingArrivals | None = None
        self._start_time = 0.0
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
        try:
            self._start()
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
                heartbeat_interval=self.heartbeat_interval,
                max_requests=self.admission.worker.max_requests,
                max_tokens=self.admission.worker.max_tokens,
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
        if "ready" in msg:  # else a beat of a worker that is ready already
            ready[msg["rank"]] = msg["ready"]

    def kill(self, rank: int) -> None:
        """Kill worker ``rank`` outright, its process or its Ray actor (as a crash would)."""
        self.handles[rank].kill()

    # ---- driving a workload -------------------------------------------------------------

    def run(
        self, workload: Workload, on_route: Callable[[LiveFleet, int], None] | None = None
    ) -> FleetSummary:
        """Send ``workload`` through the fleet on the wall clock until every request ended,
        stop the workers and summarise. ``on_route(fleet, n)`` is called after the n-th
        request is sent to a worker."""
        pending = self._pending = PendingArrivals(workload)
        dispatcher = self.dispatcher
        self._on_route = on_route
        start = self._start_time = time.monotonic()
        self._poller.register(self._report, zmq.POLLIN)
        self._last_seen = [start] * self.num_workers
        next_check, next_load, interrupted = start, start, False
        try:
            while pending or self._inflight or dispatcher.queue:
                now = time.monotonic()
                elapsed = now - start
                dispatcher.expire(elapsed)
                for arrival in pending.due(elapsed):
                    arrival.req.arrival_time = arrival.time
                    dispatcher.arrive(arrival.req)
                if dispatcher.queue:
                    dispatcher.pump()
                self._take_out_doomed()
                if now >= next_check:
                    self._check_workers(now, sample_loads=now >= next_load)
                    if now >= next_load:
                        next_load = now + self.load_interval
                    next_check = now + min(self.heartbeat_interval, self.heartbeat_timeout / 4)
                soonest = min(pending.next_time(), dispatcher.next_deadline()) - elapsed
                wait = min(soonest, next_check - now, 0.05)
                for sock, events in self._poller.poll(max(0, int(wait * 1000))):
                    if sock is self._report:
                        self._take_reports()
                    elif sock in self._sentinels:
                        self._mark_dead(self._sentinels[sock], "its process exited")
                    else:
                        rank = self._dealers.index(sock)
                        if events & zmq.POLLOUT and self.alive[rank]:
                            self._flush(rank)
                        while self.alive[rank] and sock.poll(0):
                            self._receive(rank, sock.recv(), time.monotonic() - start)
                if isinstance(self.router, KvRouter):
                    self.router.poll(0)
        except KeyboardInterrupt:
            interrupted = True
        wall = time.monotonic() - start
        self.close()
        return self._summary(wall, interrupted)

    def _elapsed(self) -> float:
        return time.monotonic() - self._start_time

    def _deliver(self, rank: int, req: Req) -> bool:
        """Send ``req`` to worker ``rank``. When its socket's queue is full (the worker reads
        more slowly than requests come), the request waits in that worker's outbox here and
        goes out as the socket takes it; it is in flight on that worker from now on."""
        self._inflight[req.rid] = (rank, req)
        self._load[rank] += 1
        self.routed[rank] += 1
        outbox = self._outboxes[rank]
        outbox.append(req)
        if len(outbox) == 1:
            self._flush(rank)
        if self._on_route is not None:
            self._on_route(self, sum(self.routed))
        return True

    def _flush(self, rank: int) -> None:
        """Send what waits in worker ``rank``'s outbox while its socket takes it; a socket
        error other than a full queue takes the worker out."""
        outbox, dealer = self._outboxes[rank], self._dealers[rank]
        while outbox:
            req = outbox[0]
            if self._inflight.get(req.rid, (None,))[0] != rank:  # it ended meanwhile
                outbox.popleft()
                continue
            try:
                dealer.send(encode(_generate_message(req)), zmq.NOBLOCK)
            except zmq.Again:
                break
            except zmq.ZMQError as exc:
                self._doomed.setdefault(rank, f"request socket error: {exc.strerror}")
                break
            outbox.popleft()
        events = zmq.POLLIN | (zmq.POLLOUT if outbox else 0)
        if self.alive[rank]:
            self._poller.modify(dealer, events)

    def _abort(self, rank: int, req: Req) -> None:
        """``req`` timed out on worker ``rank`` before its first token: abort it there and
        end it here."""
        with contextlib.suppress(zmq.ZMQError):
            self._dealers[rank].send(encode(ControlReq(type="abort", rid=req.rid)), zmq.NOBLOCK)
        self._aborting.add(req.rid)
        self._inflight.pop(req.rid)
        self._load[rank] -= 1
        self._end(req, rank, self.dispatcher.ended(req))

    def _closed(self, req: Req, rank: int | None, outcome: Outcome) -> None:
        """A request the dispatcher ended: refused or timed out at the router, refused by a
        worker, or failed for want of a worker."""
        self._end(req, rank, outcome)

    def _end(self, req: Req, rank: int | None, outcome: Outcome) -> None:
        req.finished_output = True
        if rank is not None and outcome in ("done", "failed"):
            self._tallies[rank].add(req)
            if outcome == "done":
                self._input_tokens[rank] += len(req.origin_input_ids)
            else:
                self._failed[rank] += 1
        if self.record is not None:
            self.record(req, rank, outcome, 0.0)
        if self._pending is not None:
            self._pending.finished(req, self._elapsed())

    def _receive(self, rank: int, payload: bytes, now: float) -> None:
        """Take in one message from worker ``rank``, ``now`` seconds from the start. Outputs
        for a request routed to another worker are logged and ignored."""
        try:
            msg = decode_server_message(payload)
            if isinstance(msg, BatchTokenIDOutput):
                _check_columns(msg)
        except (msgspec.DecodeError, RecursionError, ValueError) as exc:
            self._bad_message(rank, exc)
            return
        self._last_seen[rank] = time.monotonic()
        self._bad_in_a_row[rank] = 0
        if isinstance(msg, BatchTokenIDOutput):
            self._outputs(rank, msg, now)
        elif isinstance(msg, ControlReply):
            if msg.type == "get_loads" and msg.loads:
                self._tallies[rank].timeline.add(
                    now,
                    int(msg.loads.get("num_running_reqs", 0)),
                    int(msg.loads.get("num_waiting_reqs", 0)),
                )
        elif isinstance(msg, ErrorReply):
            if msg.rid in self._aborting:  # its abort came too late: it had ended there
                self._aborting.discard(msg.rid)
            elif msg.rid not in self._inflight:  # e.g. a heartbeat it refused
                log.warning("fleet.worker_refused", worker=rank, rid=msg.rid, error=msg.message)
            elif (req := self._routed_to(rank, msg.rid)) is not None:
                del self._inflight[msg.rid]
                self._load[rank] -= 1
                self.dispatcher.worker_refused(rank, req, f"worker {rank}: {msg.message}")

    def _outputs(self, rank: int, msg: BatchTokenIDOutput, now: float) -> None:
        cached = msg.cached_tokens if len(msg.cached_tokens) == len(msg.rids) else None
        for i, (rid, tokens, reason) in enumerate(
            zip(msg.rids, msg.output_ids, msg.finished_reasons, strict=True)
        ):
            if rid in self._aborting:
                if reason is not None:
                    self._aborting.discard(rid)
                continue
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
                if cached is not None:
                    req.cached_tokens = cached[i]
                del self._inflight[rid]
                self._load[rank] -= 1
                self._end(req, rank, self.dispatcher.ended(req))

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

    def _take_reports(self) -> None:
        """Beats (and a late error) from the workers' report sockets."""
        now = time.monotonic()
        while self._report.poll(0):
            try:
                msg = self._decode_report(self._report.recv())
                rank = msg["rank"]
                alive = self.alive[rank]
            except (msgspec.DecodeError, KeyError, IndexError, TypeError) as exc:
                log.warning("fleet.bad_report", error=str(exc)[:200])
                continue
            if not alive:
                continue
            if "error" in msg:
                self._mark_dead(rank, f"it failed: {msg['error']}")
            else:
                self._last_seen[rank] = max(self._last_seen[rank], now)

    def _check_workers(self, now: float, sample_loads: bool) -> None:
        """A worker that exited or sent no beat for ``heartbeat_timeout`` seconds is taken
        out; the others are asked for their loads when ``sample_loads``."""
        self._take_reports()  # beats that waited while this process was busy count
        for rank, handle in enumerate(self.handles):
            if not self.alive[rank]:
                continue
            if not handle.is_alive():
                self._mark_dead(rank, "its process exited")
            elif now - self._last_seen[rank] > self.heartbeat_timeout:
                self._mark_dead(rank, f"no heartbeat for {self.heartbeat_timeout:g} s")
            elif sample_loads:
                with contextlib.suppress(zmq.Again):
                    self._dealers[rank].send(encode(ControlReq(type="get_loads")), zmq.NOBLOCK)

    def _take_out_doomed(self) -> None:
        doomed, self._doomed = self._doomed, {}
        for rank, why in doomed.items():
            if self.alive[rank]:
                self._mark_dead(rank, why)

    def _mark_dead(self, rank: int, why: str) -> None:
        """Take worker ``rank`` out: nothing more is routed there; its requests in flight go
        back to the router queue (those with no first token, when there is one) or fail."""
        self.alive[rank] = False
        self.deaths[rank] = why
        self._poller.unregister(self._dealers[rank])
        for sentinel in [fd for fd, owner in self._sentinels.items() if owner == rank]:
            self._poller.unregister(sentinel)
            del self._sentinels[sentinel]
        self.router.remove(rank)
        self._outboxes[rank].clear()
        held = [req for owner, req in self._inflight.values() if owner == rank]
        for req in held:
            del self._inflight[req.rid]
            self._load[rank] -= 1
        for req in self.dispatcher.worker_lost(rank, held):
            req.finished_reason = FinishAbort(message=f"worker {rank} died: {why}")
            self._end(req, rank, "failed")

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
        d = self.dispatcher
        stats = [self.stats.get(rank, {}) for rank in range(self.num_workers)]
        workers = [
            WorkerTotals(
                tally=self._tallies[rank],
                routed=self.routed[rank],
                refused=d.refused[rank],
                timed_out=d.timed_out[rank],
                failed=self._failed[rank],
                input_tokens=self._input_tokens[rank],
                cached_tokens=s.get("cached_tokens", 0),
                computed_tokens=s.get("computed_tokens", 0),
                peak_held_requests=d.peak_held_requests[rank],
                peak_held_tokens=d.peak_held_tokens[rank],
                wall_seconds=s.get("uptime_seconds", math.nan),
                peak_rss_mib=s.get("peak_rss_mb", math.nan),
                alive=self.alive[rank],
                taken_out=self.deaths.get(rank),
            )
            for rank, s in enumerate(stats)
        ]
        return fleet_summary(
            policy=self.policy,
            mode="live",
            replay=self.replay,
            admission=describe_admission(self.admission),
            workers=workers,
            router=RouterFigures(
                requests_refused=d.router_refused,
                requests_timed_out=d.router_timed_out,
                requests_failed=d.router_failed,
                peak_queued_requests=d.router_peak_requests,
                peak_queued_prompt_tokens=d.router_peak_tokens,
                requests_requeued=sum(d.requeued),
            ),
            run_seconds=wall,
            simulated_seconds=math.nan,
            wall_seconds=wall,
            interrupted=interrupted,
        )


def _generate_message(req: Req) -> GenerateReqInput:
    """The ``GenerateReqInput`` a worker gets for ``req`` (its packed prompt as a list)."""
    params = req.sampling_params
    return GenerateReqInput(
        rid=req.rid,
        input_ids=req.origin_input_ids.tolist(),
        sampling_params=SamplingParamsInput(
            max_new_tokens=params.max_new_tokens,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=params.ignore_eos,
            stream=True,
            stream_interval=params.stream_interval,
        ),
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
