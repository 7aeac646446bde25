"""How a fleet's ``Dispatcher`` ends or takes back the requests it holds: ends seen on a worker,
a worker's refusals, a lost worker's requests, timeouts, withdrawals; and the outcomes they
give. Mixed into ``Dispatcher``."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from typing import Literal

from schedkit.core.schedule_batch import FinishAbort, Req

__all__ = ["MAX_REQUEUES", "TIMED_OUT", "Outcome", "RequestEnds"]

Outcome = Literal["done", "refused", "timed_out", "failed"]

TIMED_OUT = "timed out: no first token within the admission timeout"
MAX_REQUEUES = 8  # times one request may go back to the router queue after a refusal


class RequestEnds:
    """``ended``, ``worker_refused``, ``worker_lost``, ``expire`` and ``withdraw`` of
    ``Dispatcher``.

    Uses the dispatcher's limits, queue (``queue``, ``queued_tokens``), per-worker counts,
    where each request is held (``_where``), ``_requeues``, ``_aborted``, ``_deadlines``,
    ``_full`` and its ``_release``, ``_enqueue``, ``_close`` and ``abort``.
    """

    __slots__ = ()

    def ended(self, req: Req) -> Outcome:
        """A worker ended ``req`` (finished, failed, or aborted after its timeout): its room
        is free again. Returns the outcome, counting a timeout against its worker."""
        rank = self._release(req)
        self._requeues.pop(req.rid, None)
        if req.rid in self._aborted:
            self._aborted.discard(req.rid)
            if rank is not None:
                self.timed_out[rank] += 1
            req.finished_reason = FinishAbort(message=TIMED_OUT)
            return "timed_out"
        return "failed" if isinstance(req.finished_reason, FinishAbort) else "done"

    def worker_refused(self, rank: int, req: Req, why: str) -> None:
        """Worker ``rank`` refused ``req`` (``why``): back to the head of the router queue
        (the worker takes nothing more until one of its requests ends), or refused by that
        worker."""
        self._release(req)
        tries = self._requeues[req.rid] = self._requeues.get(req.rid, 0) + 1
        # Requeued only while the worker holds others (room comes back when one ends), and
        # only so often: a request a worker refuses for another reason must not circle.
        if self.has_router_queue and self.held_requests[rank] > 0 and tries <= MAX_REQUEUES:
            self._full.add(rank)
            self.requeued[rank] += 1
            self._enqueue(req, len(req.origin_input_ids), front=True)
        else:
            self._requeues.pop(req.rid, None)
            self.refused[rank] += 1
            self._close(req, rank, "refused", why)

    def worker_lost(self, rank: int, reqs: Sequence[Req]) -> list[Req]:
        """Worker ``rank`` is gone with ``reqs`` on it: with a router queue, those that had
        no first token go back to the queue's head; returns the rest (the fleet fails
        them)."""
        lost = []
        for req in reversed(reqs):
            self._release(req)
            if self.has_router_queue and req.first_token_time is None:
                self._enqueue(req, len(req.origin_input_ids), front=True)
            else:
                lost.append(req)
        self._full.discard(rank)
        return lost[::-1]

    def expire(self, now: float) -> None:
        """End every request whose timeout passed by ``now`` with no first token: at the
        router it is closed at once, on a worker it is aborted there (``abort``)."""
        deadlines = self._deadlines
        expired: set[str] = set()
        while deadlines and deadlines[0][0] <= now:
            expired.add(heapq.heappop(deadlines)[1])
        if not expired:
            return
        if self.queue:
            kept: deque[Req] = deque()
            for req in self.queue:
                if req.rid in expired:
                    self.queued_tokens -= len(req.origin_input_ids)
                    self.router_timed_out += 1
                    self._close(req, None, "timed_out", TIMED_OUT)
                else:
                    kept.append(req)
            self.queue = kept
        for rid in expired:
            entry = self._where.get(rid)
            if entry is None or entry[1].first_token_time is not None or rid in self._aborted:
                continue
            rank, req = entry
            self._aborted.add(rid)
            self.abort(rank, req)

    def withdraw(self, rid: str) -> Req | None:
        """Take request ``rid`` out of the router queue (its client gave up); the request, or
        None when it is not queued here."""
        for req in self.queue:
            if req.rid == rid:
                self.queue.remove(req)
                self.queued_tokens -= len(req.origin_input_ids)
                self._requeues.pop(rid, None)
                return req
        return None
