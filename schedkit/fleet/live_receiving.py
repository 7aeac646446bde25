"""What the live fleet takes from its workers: outputs, load replies, refusals, bad messages."""

from __future__ import annotations

import math
import time

import msgspec
import structlog

from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    ControlReply,
    ErrorReply,
    RequestTimes,
    decode_server_message,
)
from schedkit.core.schedule_batch import Req

__all__ = ["LiveReceiving"]

# The live fleet's logger: its records name the fleet whichever part of it logs.
log = structlog.get_logger("schedkit.fleet.live")


class LiveReceiving:
    """``_receive`` of ``LiveFleet`` and what it calls: a worker's outputs give the latencies
    (see ``schedkit.fleet.live``), its load replies go to the router and the worker's
    timeline, its refusals to the dispatcher; a message that does not decode is counted.
    Mixed into ``LiveFleet``.

    Uses the fleet's requests in flight (``_inflight``, ``_aborting``, ``_load``,
    ``_sent_at``), ``router``, ``dispatcher``, ``_tallies``, ``_last_seen``,
    ``bad_messages``, ``_bad_in_a_row``, ``max_bad_messages``, ``_end`` and ``_mark_dead``.
    """

    __slots__ = ()

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
                if self.router is not None:
                    self.router.report(
                        rank,
                        kv_usage=msg.loads.get("token_usage"),
                        waiting=msg.loads.get("num_waiting_reqs"),
                    )
                self._tallies[rank].timeline.add(
                    now,
                    int(msg.loads.get("num_running_reqs", 0)),
                    int(msg.loads.get("num_waiting_reqs", 0)),
                )
            else:
                self._control_reply(rank, msg)
        elif isinstance(msg, ErrorReply):
            if msg.rid in self._aborting:  # its abort came too late: it had ended there
                self._aborting.discard(msg.rid)
            elif msg.rid not in self._inflight:  # e.g. a heartbeat it refused
                log.warning("fleet.worker_refused", worker=rank, rid=msg.rid, error=msg.message)
            elif (req := self._routed_to(rank, msg.rid)) is not None:
                del self._inflight[msg.rid]
                self._load[rank] -= 1
                self.dispatcher.worker_refused(rank, req, f"worker {rank}: {msg.message}")

    def _control_reply(self, rank: int, msg: ControlReply) -> None:
        """A worker's reply to a control message other than a load query (its answers to the
        router's aborts need nothing)."""

    def _outputs(self, rank: int, msg: BatchTokenIDOutput, now: float) -> None:
        cached = msg.cached_tokens if len(msg.cached_tokens) == len(msg.rids) else None
        times = msg.time_stats
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
                    if self.router is not None:
                        self.router.prefilled(rid)
                    req.itl.extend([0.0] * (len(tokens) - 1))
                else:
                    req.itl.extend([(now - last) / len(tokens)] * len(tokens))
                req.last_token_time = now
                req.output_ids.extend(tokens)
            if reason is not None:
                req.finished_reason, req.finish_time = reason, now
                if cached is not None:
                    req.cached_tokens = cached[i]
                if times is not None:
                    self._scheduled(req, times[i])
                del self._inflight[rid]
                self._load[rank] -= 1
                self._end(req, rank, self.dispatcher.ended(req))

    def _scheduled(self, req: Req, times: RequestTimes | None) -> None:
        """Set ``req.scheduled_time`` on this clock: when it left for its worker plus the
        time it waited in that worker's scheduler (the worker's own clock, a difference)."""
        sent = self._sent_at.get(req.rid)
        if sent is None or times is None or times.scheduled_time is None:
            return
        waited = times.scheduled_time - times.arrival_time
        if 0 <= waited < math.inf:
            req.scheduled_time = sent + waited

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


def _check_columns(msg: BatchTokenIDOutput) -> None:
    """ValueError unless the per-request columns the router reads have one entry per rid."""
    lengths = {
        "rids": len(msg.rids),
        "output_ids": len(msg.output_ids),
        "finished_reasons": len(msg.finished_reasons),
    }
    if msg.time_stats is not None:
        lengths["time_stats"] = len(msg.time_stats)
    if len(set(lengths.values())) > 1:
        found = ", ".join(f"{name} {n}" for name, n in lengths.items())
        raise ValueError(f"BatchTokenIDOutput columns differ in length ({found}); one per rid")
