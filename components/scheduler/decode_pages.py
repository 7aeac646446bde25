"""A decode step's KV slots taken a page at a time instead of a slot per request per step.

Every running request needs one KV slot per decode step: the next slot of its last page, or
the first slot of a new page when its last page is full. With pages of several slots the next
slot is known without asking the allocator, so ``DecodePages`` does not append it to
``req.kv_indices`` each step: it counts the steps its requests took part in, and writes the
slots a request is owed into its list only when the list is read or replaced (``Req.kv_indices``
calls ``complete`` or ``leave``). Each request is filed under the step at which it next needs
a new page; a step allocates pages for those requests only, in batch order, exactly the pages
the slot-by-slot loop would have taken.

A step's batch is compared with the previous one (a list comparison, by identity, at C speed):
requests that left are written out and dropped, requests that joined are filed.
"""

from __future__ import annotations

from typing import Protocol

from schedkit.core.protocols import KVAllocator
from schedkit.core.schedule_batch import Req

__all__ = ["DecodePages", "PagedSlots"]


class PagedSlots(Protocol):
    """What ``DecodePages`` needs of the scheduler's KV slots (``batching.KVSlots``)."""

    allocator: KVAllocator
    page_size: int

    def ensure_free(self, n: int) -> bool:
        """Make ``n`` slots free, evicting from the cache if needed; True if they are free."""
        ...


class DecodePages:
    """The decode KV slots of one scheduler's running requests (page size above 1)."""

    __slots__ = ("_due", "_member_set", "_members", "_position", "kv", "page_size", "step")

    def __init__(self, kv: PagedSlots) -> None:
        self.kv = kv
        self.page_size = kv.page_size
        # Decode steps taken so far; a member's list is complete up to ``req.kv_run_step``.
        self.step = 0
        self._members: list[Req] | None = None
        self._member_set: set[Req] = set()
        self._position: dict[Req, int] | None = None
        # Step -> members whose last page is full before that step.
        self._due: dict[int, list[Req]] = {}

    def take(self, reqs: list[Req]) -> bool:
        """Give every request in ``reqs`` one slot for its next token; False, with nothing
        taken, if the pool cannot supply the new pages even after evicting from the cache."""
        if reqs != self._members:
            self._regroup(reqs)
        step, page_size = self.step, self.page_size
        due = self._due.pop(step, None)
        if due:
            members = self._member_set
            needing = [
                req
                for req in due
                if req.kv_run is self
                and req in members
                and not (len(req._kv_indices) + step - req.kv_run_step) % page_size
            ]
            if len(needing) > 1:
                if self._position is None:
                    self._position = dict(zip(reqs, range(len(reqs)), strict=True))
                needing.sort(key=self._position.__getitem__)
            kv = self.kv
            if needing and not kv.ensure_free(len(needing) * page_size):
                self._due[step] = due
                return False
            if needing:
                pages = kv.allocator.alloc(len(needing) * page_size)[::page_size]
                later = self._due.setdefault(step + page_size, [])
                for req, slot in zip(needing, pages, strict=True):
                    self.complete(req)
                    req._kv_indices.append(slot)
                    req.kv_run_step = step + 1
                    later.append(req)
        self.step = step + 1
        return True

    def complete(self, req: Req) -> None:
        """Append the slots ``req`` took since its list was last written (all in its last
        page, which had room for them)."""
        pending = self.step - req.kv_run_step
        if pending > 0:
            kv = req._kv_indices
            last = kv[-1]
            kv.extend(range(last + 1, last + 1 + pending))
            req.kv_run_step = self.step

    def leave(self, req: Req) -> None:
        """Write ``req``'s slots and stop taking any for it (its list is being replaced)."""
        self._drop(req)
        self._member_set.discard(req)
        self._members = None  # the next step regroups even if its batch is the same list
        self._position = None

    def _regroup(self, reqs: list[Req]) -> None:
        new = set(reqs)
        old = self._member_set
        for req in old - new:
            if req.kv_run is self:
                self._drop(req)
        for req in new - old:
            if req.kv_run is not None:
                req.kv_run.leave(req)
            self._file(req)
        self._members = list(reqs)
        self._member_set = new
        self._position = None

    def _file(self, req: Req) -> None:
        req.kv_run = self
        req.kv_run_step = self.step
        due = self.step + -len(req._kv_indices) % self.page_size
        self._due.setdefault(due, []).append(req)

    def _drop(self, req: Req) -> None:
        self.complete(req)
        req.kv_run = None
        filed = self._due.get(self.step + -len(req._kv_indices) % self.page_size)
        if filed is not None and req in filed:
            filed.remove(req)
