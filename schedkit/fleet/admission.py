"""Admission control for a fleet: how much each worker and the router may hold, and the
``Dispatcher`` that applies it to every request, offline and live alike.

A worker holds a request from the moment it is routed there until it ends (queued or
running); ``AdmissionLimits.worker`` caps what one worker holds, in requests and in prompt
tokens. With ``AdmissionLimits.router`` set, the router keeps a queue of its own: a request
no worker has room for waits there (first in, first out), and a request a worker refuses
goes back to the head of that queue instead of failing (up to ``MAX_REQUEUES`` times, and
only while that worker holds other requests, whose ends give it room again); the queue
itself is capped in requests and prompt tokens. Without it, a request the chosen worker
cannot take is refused by that worker. ``timeout`` is counted from a request's arrival: a
request with no first token by then (waiting at the router or at a worker) is taken back
and counted as timed out.

Refusals and timeouts are outcomes of their own, counted where they happened and never
sampled as latency. Waiting prompts are held packed, 4 bytes a token (``pack_prompt``).
The caps are declared in ``admission_limits``; how held requests end or are taken back, in
``admission_ends``.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from collections.abc import Callable, Sequence

from schedkit.core.schedule_batch import FinishAbort, Req
from schedkit.fleet.admission_ends import MAX_REQUEUES, TIMED_OUT, Outcome, RequestEnds
from schedkit.fleet.admission_limits import AdmissionLimits, QueueLimits, describe_admission
from schedkit.router import Router

__all__ = [
    "MAX_REQUEUES",
    "TIMED_OUT",
    "AdmissionLimits",
    "Dispatcher",
    "Outcome",
    "QueueLimits",
    "describe_admission",
    "pack_prompt",
]

NO_WORKER = "no live worker to route to"


def route_by(router: Callable[[], Router]) -> Callable[[Req, Sequence[int]], int]:
    """The dispatcher's ``route``: the rank the router (bound late: ``router()``) picks for a
    request among ``ranks``, with what the request carries for the policy (its id,
    conversation key and namespace)."""

    def route(req: Req, ranks: Sequence[int]) -> int:
        return (
            router()
            .route(
                req.origin_input_ids,
                among=ranks,
                rid=req.rid,
                session=req.routing_key,
                extra_key=req.extra_key,
                cache_salt=req.cache_salt,
            )
            .rank
        )

    return route


def pack_prompt(req: Req) -> Req:
    """``req`` with its prompt packed (``array('I')``, 4 bytes a token) while it waits."""
    ids = req.origin_input_ids
    if not (isinstance(ids, array) and ids.typecode == "I"):
        req.origin_input_ids = array("I", ids)
    return req


class Dispatcher(RequestEnds):
    """Applies ``AdmissionLimits`` to a fleet's requests on the run's clock (seconds from the
    start).

    The fleet calls ``arrive`` for each new request, ``ended`` when a worker finished or
    failed one, ``worker_refused`` when a worker refused one, ``worker_lost`` when a worker
    is taken out, and ``expire``/``pump`` as its clock moves. The dispatcher calls back:
    ``route(req, ranks)`` for the rank to send to (from the live ``ranks`` with room),
    ``deliver(rank, req)`` to send it (False: the worker could not take it), ``abort(rank,
    req)`` to take back a request that timed out on a worker, and ``closed(req, rank,
    outcome)`` for each request it ends itself (refused or timed out; ``rank`` None at the
    router).
    """

    def __init__(
        self,
        limits: AdmissionLimits,
        num_workers: int,
        *,
        live_ranks: Callable[[], Sequence[int]],
        route: Callable[[Req, list[int]], int],
        deliver: Callable[[int, Req], bool],
        abort: Callable[[int, Req], None],
        closed: Callable[[Req, int | None, Outcome], None],
        check_worker_limits: bool = True,
    ) -> None:
        self.limits = limits
        self.live_ranks, self.route, self.deliver = live_ranks, route, deliver
        self.abort, self.closed = abort, closed
        # Live workers enforce their own limits; without a router queue the router leaves
        # the refusal to them.
        self.check_worker_limits = check_worker_limits
        self.held_requests = [0] * num_workers
        self.held_tokens = [0] * num_workers
        self.peak_held_requests = [0] * num_workers
        self.peak_held_tokens = [0] * num_workers
        self.refused = [0] * num_workers
        self.timed_out = [0] * num_workers
        self.requeued = [0] * num_workers
        self.router_refused = self.router_timed_out = self.router_failed = 0
        self.router_peak_requests = self.router_peak_tokens = 0
        self.queue: deque[Req] = deque()
        self.queued_tokens = 0
        self._full: set[int] = set()  # refused a request; no room until one of its own ends
        self._where: dict[str, tuple[int, Req]] = {}  # rid -> (rank, request) held there
        self._requeues: dict[str, int] = {}  # rid -> times a worker refused it
        self._aborted: set[str] = set()  # timed out on a worker, its end not seen yet
        self._deadlines: list[tuple[float, str]] = []
        self._pump_due = False

    @property
    def has_router_queue(self) -> bool:
        """True when requests may wait at the router."""
        return self.limits.router is not None

    def deadline(self, req: Req) -> float:
        """When ``req`` times out (seconds from the start); inf without a timeout."""
        timeout = self.limits.timeout
        return math.inf if timeout is None else req.arrival_time + timeout

    @property
    def pump_due(self) -> bool:
        """True when requests wait at the router and a worker's room changed since the last
        ``pump``."""
        return self._pump_due and bool(self.queue)

    def next_deadline(self) -> float:
        """The next time a request may time out (seconds from the start; inf: none)."""
        return self._deadlines[0][0] if self._deadlines else math.inf

    def _choose(self, req: Req, ranks: list[int]) -> int:
        """The policy's choice among ``ranks``; the only one without asking (a prefix match
        hashes the whole prompt)."""
        return ranks[0] if len(ranks) == 1 else self.route(req, ranks)

    def _has_room(self, rank: int, tokens: int) -> bool:
        if rank in self._full:
            return False
        return self.limits.worker.admits(self.held_requests[rank], self.held_tokens[rank], tokens)

    def arrive(self, req: Req) -> None:
        """A new request (its ``arrival_time`` set, in seconds from the start)."""
        pack_prompt(req)
        tokens = len(req.origin_input_ids)
        if self.limits.worker.never_admits(tokens):
            self.router_refused += 1
            self._close(req, None, "refused", f"{tokens} prompt tokens exceed a worker's limit")
            return
        if self.limits.timeout is not None:
            heapq.heappush(self._deadlines, (self.deadline(req), req.rid))
        if not self.has_router_queue:
            ranks = list(self.live_ranks())
            if not ranks:
                self._close(req, None, "failed", NO_WORKER)
                return
            rank = self._choose(req, ranks)
            if self.check_worker_limits and not self._has_room(rank, tokens):
                self.refused[rank] += 1
                self._close(req, rank, "refused", f"worker {rank} is full")
                return
            self._dispatch(rank, req)
            return
        if not self.queue and self._send_from_router(req):
            return
        router = self.limits.router
        if not router.admits(len(self.queue), self.queued_tokens, tokens):
            self.router_refused += 1
            self._close(req, None, "refused", "the router queue is full")
            return
        self._enqueue(req, tokens, front=False)

    def _enqueue(self, req: Req, tokens: int, *, front: bool) -> None:
        if front:
            self.queue.appendleft(req)
        else:
            self.queue.append(req)
        self.queued_tokens += tokens
        self.router_peak_requests = max(self.router_peak_requests, len(self.queue))
        self.router_peak_tokens = max(self.router_peak_tokens, self.queued_tokens)

    def _send_from_router(self, req: Req) -> bool:
        """Route ``req`` to a live worker with room; False when none has room."""
        tokens = len(req.origin_input_ids)
        ranks = [r for r in self.live_ranks() if self._has_room(r, tokens)]
        if not ranks:
            return False
        self._dispatch(self._choose(req, ranks), req)
        return True

    def _dispatch(self, rank: int, req: Req) -> None:
        tokens = len(req.origin_input_ids)
        self._where[req.rid] = (rank, req)
        held = self.held_requests[rank] = self.held_requests[rank] + 1
        held_tokens = self.held_tokens[rank] = self.held_tokens[rank] + tokens
        self.peak_held_requests[rank] = max(self.peak_held_requests[rank], held)
        self.peak_held_tokens[rank] = max(self.peak_held_tokens[rank], held_tokens)
        if not self.deliver(rank, req):
            self._release(req)
            if self.has_router_queue:
                self._enqueue(req, tokens, front=True)
            else:
                self._close(req, rank, "failed", f"worker {rank} could not take it")

    def _release(self, req: Req) -> int | None:
        """Forget where ``req`` was dispatched; the rank it was held on, if any."""
        where = self._where.pop(req.rid, None)
        if where is None:
            return None
        rank = where[0]
        self.held_requests[rank] -= 1
        self.held_tokens[rank] -= len(req.origin_input_ids)
        if self._full:
            self._full.discard(rank)
        self._pump_due = True
        return rank

    def _close(self, req: Req, rank: int | None, outcome: Outcome, why: str) -> None:
        req.finished_reason = FinishAbort(message=why)
        if rank is None and outcome == "failed":
            self.router_failed += 1
        self.closed(req, rank, outcome)

    def pump(self) -> None:
        """Send waiting requests from the router queue, in order, while a worker has room."""
        self._pump_due = False
        queue = self.queue
        while queue:
            req = queue[0]
            tokens = len(req.origin_input_ids)
            ranks = [r for r in self.live_ranks() if self._has_room(r, tokens)]
            if not ranks:
                if not self.live_ranks():  # nobody left to wait for
                    queue.popleft()
                    self.queued_tokens -= tokens
                    self._close(req, None, "failed", NO_WORKER)
                    continue
                return
            queue.popleft()
            self.queued_tokens -= tokens
            self._dispatch(self._choose(req, ranks), req)
