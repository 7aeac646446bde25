"""What the steps of an offline fleet's workers tell its router, kept until the router routes.

A step's news (its KV-event batches, the requests that got their first token, those that
ended, the worker's KV usage and waiting requests) is dated by the step's end on the worker's
clock. ``catch_up(now)`` gives the router everything dated up to ``now``, in the order the
steps ran (by end time, then start time and rank). A report only overwrites the worker's
figures, so of a worker's reports due by then only the last is applied.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_right
from collections.abc import Callable, Sequence

from schedkit.assembly.container import Assembly
from schedkit.core.schedule_batch import Req
from schedkit.fleet.events import QueueEventPublisher
from schedkit.kv_events import EventBatch
from schedkit.router import Router

__all__ = ["RouterNews"]


class RouterNews:
    """The news of each worker of ``assemblies`` (rank ``r`` is the ``r``-th) for ``router``;
    ``channels`` are the workers' queue publishers (none when KV events are off), ``decode``
    the wire decoding of their batches (None: the channels keep index views, see
    ``QueueEventPublisher.keep_for_index``)."""

    def __init__(
        self,
        assemblies: Sequence[Assembly],
        router: Router,
        channels: Sequence[QueueEventPublisher],
        decode: Callable[[bytes], EventBatch] | None = None,
    ) -> None:
        self.router = router
        self.channels = channels
        self.decode = decode
        self.backlog = 0  # steps whose news the router has not been given yet
        self._schedulers = [a["scheduler"] for a in assemblies]
        self._used = [_kv_used(a) for a in assemblies]
        self._usage = [_kv_usage(used, size) for used, size in self._used]
        self._awaiting: list[set[str]] = [set() for _ in assemblies]  # no first token seen yet
        self._dated: list = []  # (end, start, rank, order, batches, prefilled, ended)
        self._order = itertools.count()
        self._report_ends: list[list[float]] = [[] for _ in assemblies]
        self._reports: list[list[tuple[float, int]]] = [[] for _ in assemblies]

    def routed(self, rank: int, rid: str) -> None:
        """``rid`` went to worker ``rank``: its first token is news to come."""
        self._awaiting[rank].add(rid)

    def after_step(self, rank: int, finished: list[Req], start: float, end: float) -> None:
        """Note what the step of worker ``rank`` that just ran (from ``start`` to ``end``,
        ending ``finished``) told the router."""
        awaiting = self._awaiting[rank]
        scheduler = self._schedulers[rank]
        prefilled = []
        if awaiting:
            for req in scheduler.running_batch.reqs:
                if req.rid in awaiting and req.output_ids:
                    awaiting.discard(req.rid)
                    prefilled.append(req.rid)
        ended = []
        if finished:
            ended = [req.rid for req in finished]
            awaiting.difference_update(ended)
        batches = self._published(rank)
        if batches or prefilled or ended:
            heapq.heappush(
                self._dated, (end, start, rank, next(self._order), batches, prefilled, ended)
            )
        self._report_ends[rank].append(end)
        self._reports[rank].append((self._usage[rank](), len(scheduler.waiting_queue)))
        self.backlog += 1

    def after_run(
        self, rank: int, start: float, ends: list[float], taken: list[tuple[int, int]]
    ) -> None:
        """Note what a run of decode steps of worker ``rank`` told the router
        (``Stepper.run_decode``: from ``start``, steps ending at ``ends``, ``taken`` the
        steps that took new KV slots and how many), as ``after_step`` for each step would:
        no request got its first token or ended, KV events come only from the last step, and
        the KV usage changes only at the steps in ``taken``. Of a run of reports with the same
        figures only the first is kept: the router takes the last one due, whose figures it
        has."""
        scheduler = self._schedulers[rank]
        batches = self._published(rank)
        if batches:
            last_start = ends[-2] if len(ends) > 1 else start
            heapq.heappush(
                self._dated, (ends[-1], last_start, rank, next(self._order), batches, [], [])
            )
        used, size = self._used[rank]
        waiting = len(scheduler.waiting_queue)
        held = used() - sum(slots for _, slots in taken)  # before the run
        report_ends, reports = self._report_ends[rank], self._reports[rank]
        if not taken or taken[0][0]:
            report_ends.append(ends[0])
            reports.append((held / size, waiting))
        for step, slots in taken:
            held += slots
            report_ends.append(ends[step])
            reports.append((held / size, waiting))
        self.backlog += len(ends)

    def _published(self, rank: int) -> list:
        """The KV-event batches worker ``rank`` published since they were last taken."""
        if not self.channels:
            return []
        channel = self.channels[rank]
        if not channel.queue_depth:
            return []
        decode = self.decode
        if decode is None:
            return [batch for _, batch in channel.take()]
        return [decode(payload) for _, payload in channel.take()]

    def take_events(self, rank: int) -> None:
        """Apply the KV events worker ``rank`` published and nobody took yet, now."""
        apply = self.router.index.apply
        for batch in self._published(rank):
            apply(batch, rank)

    def catch_up(self, now: float) -> None:
        """Give the router the news dated up to ``now`` (seconds); ``now`` must not be past
        the start of a step still to run."""
        dated, router = self._dated, self.router
        apply = router.index.apply
        while dated and dated[0][0] <= now:
            _, _, rank, _, batches, prefilled, ended = heapq.heappop(dated)
            for batch in batches:
                apply(batch, rank)
            for rid in prefilled:
                router.prefilled(rid)
            for rid in ended:
                router.finished(rid)
        backlog = len(dated)
        for rank, ends in enumerate(self._report_ends):
            if not ends:
                continue
            due = bisect_right(ends, now)
            if due:
                usage, waiting = self._reports[rank][due - 1]
                router.report(rank, kv_usage=usage, waiting=waiting)
                del ends[:due], self._reports[rank][:due]
            backlog += len(ends)
        self.backlog = backlog


def _kv_used(assembly: Assembly) -> tuple[Callable[[], int], int]:
    """The worker's KV slots in use as its load reports count them (``LoadInquirer``'s
    ``num_used_tokens``: held by requests or locked in the cache) and the pool size it
    divides them by (its ``token_usage``); always 0 without an inquirer."""
    if "load_inquirer" not in assembly:
        return (lambda: 0), 1
    inquirer = assembly["load_inquirer"]
    return inquirer.num_used_tokens, inquirer.allocator.size or 1


def _kv_usage(used: Callable[[], int], size: int) -> Callable[[], float]:
    """The worker's KV-pool usage (``_kv_used`` over its pool size)."""
    return lambda: used() / size
