"""The scheduler's waiting queue: a list of requests that keeps its load totals as it changes.

The load inquirer reports how many tokens wait for prefill, how many of them the prefix cache
does not hold, and how many waiting requests were retracted. Summing those over the queue at
every report costs time linear in the queue, and a report goes out with every finished
request: under overload (tens of thousands waiting) that walk dominated the run. So the queue
keeps the three totals itself, updated by every method that adds or removes requests, and
reading them is free.

What a request contributes is fixed while it waits: its length (prompt plus output) does not
change, nor does ``is_retracted``. ``prefix_len`` does: the LPM policy stores each request's
cached-prefix match in it and then sorts the queue, and admission sets it before the admitted
requests are deleted. So the uncached tokens a request added are remembered per request (and
taken back exactly on removal), and ``sort`` counts them again from the requests as they are.
A policy that changes ``prefix_len`` without sorting should call ``recount()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import SupportsIndex

from schedkit.core.schedule_batch import Req

__all__ = ["WaitingQueue"]


class WaitingQueue(list):
    """A ``list`` of waiting requests with running totals (every mutating method keeps them).

    ``num_tokens``: prompt plus output tokens of every waiting request.
    ``num_uncached_tokens``: of those, the tokens past each request's ``prefix_len`` (as it
    was when the request joined, or at the last ``sort``/``recount``).
    ``num_retracted``: waiting requests that were retracted from the running batch.
    ``entry_time_sum``: the sum of their ``wait_queue_entry_time`` (as it was when each joined,
    or at the last ``sort``/``recount``), for the mean time waited (``mean_wait``).
    """

    __slots__ = (
        "_entered",
        "_uncached",
        "entry_time_sum",
        "num_retracted",
        "num_tokens",
        "num_uncached_tokens",
    )

    def __init__(self, reqs: Iterable[Req] = ()) -> None:
        super().__init__(reqs)
        self.recount()

    # ---- totals ------------------------------------------------------------------------

    def recount(self) -> None:
        """Compute the totals again from the requests as they are now."""
        self._uncached: dict[Req, int] = {}
        self._entered: dict[Req, float] = {}
        self.num_tokens = self.num_uncached_tokens = self.num_retracted = 0
        self.entry_time_sum = 0.0
        for req in self:
            self._count(req)

    def mean_wait(self, now: float) -> float:
        """The mean time the waiting requests have waited so far (0.0 when none wait)."""
        if not self:
            return 0.0
        return max(0.0, now - self.entry_time_sum / len(self))

    def _count(self, req: Req) -> None:
        seqlen = len(req.origin_input_ids) + len(req.output_ids)
        uncached = seqlen - req.prefix_len if seqlen > req.prefix_len else 0
        # A request queued twice (which the scheduler never does) counts twice here but is
        # remembered once; recount() would then be needed after its second removal.
        self._uncached[req] = uncached
        self._entered[req] = req.wait_queue_entry_time
        self.entry_time_sum += req.wait_queue_entry_time
        self.num_tokens += seqlen
        self.num_uncached_tokens += uncached
        self.num_retracted += req.is_retracted

    def _uncount(self, req: Req) -> None:
        self.num_tokens -= len(req.origin_input_ids) + len(req.output_ids)
        self.num_uncached_tokens -= self._uncached.pop(req, 0)
        self.entry_time_sum -= self._entered.pop(req, 0.0)
        self.num_retracted -= req.is_retracted

    # ---- adding ------------------------------------------------------------------------

    def append(self, req: Req) -> None:
        super().append(req)
        self._count(req)

    def extend(self, reqs: Iterable[Req]) -> None:
        reqs = list(reqs)
        super().extend(reqs)
        for req in reqs:
            self._count(req)

    def __iadd__(self, reqs: Iterable[Req]) -> WaitingQueue:
        self.extend(reqs)
        return self

    def insert(self, index: SupportsIndex, req: Req) -> None:
        super().insert(index, req)
        self._count(req)

    # ---- removing ----------------------------------------------------------------------

    def pop(self, index: SupportsIndex = -1) -> Req:
        req = super().pop(index)
        self._uncount(req)
        return req

    def remove(self, req: Req) -> None:
        super().remove(req)
        self._uncount(req)

    def clear(self) -> None:
        super().clear()
        self.recount()

    def __delitem__(self, index: SupportsIndex | slice) -> None:
        removed = self[index] if isinstance(index, slice) else [self[index]]
        super().__delitem__(index)
        for req in removed:
            self._uncount(req)

    def __setitem__(self, index: SupportsIndex | slice, value: Req | Iterable[Req]) -> None:
        if isinstance(index, slice):
            removed, added = self[index], list(value)
        else:
            removed, added = [self[index]], [value]
        super().__setitem__(index, added if isinstance(index, slice) else value)
        for req in removed:
            self._uncount(req)
        for req in added:
            self._count(req)

    def __imul__(self, n: SupportsIndex) -> WaitingQueue:
        super().__imul__(n)
        self.recount()
        return self

    def __reduce__(self) -> tuple:
        # copy, deepcopy and pickle rebuild the queue through __init__, which counts.
        return (type(self), (list(self),))

    # ---- reordering --------------------------------------------------------------------

    def sort(self, *, key=None, reverse: bool = False) -> None:
        """Sort in place (as ``list.sort``), then recount: policies set ``prefix_len`` and
        sort."""
        super().sort(key=key, reverse=reverse)
        self.recount()
