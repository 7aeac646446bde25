"""How the live fleet watches its workers: heartbeats, load queries, taking a worker out."""

from __future__ import annotations

import contextlib

import zmq

from schedkit.components.io.io_struct import ControlReq, encode
from schedkit.core.schedule_batch import FinishAbort

__all__ = ["LiveHealth"]


class LiveHealth:
    """``_check_workers``, ``_take_out_doomed`` and ``_mark_dead`` of ``LiveFleet`` (the last
    calling on to ``LiveWorkers._mark_dead``). Mixed into ``LiveFleet`` before ``LiveWorkers``.

    Uses the fleet's workers (``handles``, ``alive``, ``_dealers``, ``_last_seen``,
    ``heartbeat_timeout``, ``_take_reports``), ``_doomed``, ``router``, ``_outboxes``,
    ``_inflight``, ``_load``, ``dispatcher`` and ``_end``.
    """

    __slots__ = ()

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
        super()._mark_dead(rank, why)
        self.router.remove(rank)
        self._outboxes[rank].clear()
        held = [req for owner, req in self._inflight.values() if owner == rank]
        for req in held:
            del self._inflight[req.rid]
            self._load[rank] -= 1
        for req in self.dispatcher.worker_lost(rank, held):
            req.finished_reason = FinishAbort(message=f"worker {rank} died: {why}")
            self._end(req, rank, "failed")
