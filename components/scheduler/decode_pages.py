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

from operator import itemgetter, mul
from typing import Protocol

from schedkit.core.protocols import KVAllocator
from schedkit.core.schedule_batch import Req

__all__ = ["DecodePages", "PagedSlots"]

_FIRST = itemgetter(0)
_SECOND = itemgetter(1)


class PagedSlots(Protocol):
    """What ``DecodePages`` needs of the scheduler's KV slots (``kv_slots.KVSlots``)."""

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
        step = self.step
        due = self._due.pop(step, None)
        if due and self._allocate(due, reqs) is None:
            self._due[step] = due
            return False
        self.step = step + 1
        return True

    def steps_in_pool(self, reqs: list[Req], limit: int) -> int:
        """How many of the next ``limit`` decode steps of ``reqs`` (the next decode batch)
        find the pages they need free without evicting from the cache: the steps
        ``take_run`` may take. A batch other than the last step's is regrouped first, as
        ``take`` would."""
        if reqs != self._members:
            self._regroup(reqs)
        step, page_size, end = self.step, self.page_size, self.step + limit
        groups = [
            (at, len(self._needing(filed, at))) for at, filed in self._due.items() if at < end
        ]
        groups = sorted((at, needing * page_size) for at, needing in groups if needing)
        if not groups:
            return limit
        # A member needs a page every page_size steps: the groups repeat in cycles.
        free = self.kv.allocator.available_size()
        cycle = sum(slots for _, slots in groups)
        cycles = free // cycle  # cycles whose pages are all free
        free -= cycles * cycle
        shift = cycles * page_size
        for at, slots in groups:
            if at + shift >= end:
                break
            free -= slots
            if free < 0:
                return at + shift - step
        return limit

    def take_run(self, reqs: list[Req], steps: int) -> list[tuple[int, int]]:
        """``steps`` decode steps of ``reqs`` (at most ``steps_in_pool``), as as many
        ``take`` calls: the steps (counted from 0) that took new pages and the slots each
        took. The pages of the whole run are taken in one allocation, in the order the
        steps would have taken them."""
        start, page_size, due = self.step, self.page_size, self._due
        end = start + steps
        groups = []  # (first step, members needing a page then and every page_size steps)
        for at in [at for at in due if at < end]:
            needing = self._needing(due.pop(at), at)
            if needing:
                if len(needing) > 1:
                    if self._position is None:
                        self._position = dict(zip(reqs, range(len(reqs)), strict=True))
                    needing.sort(key=self._position.__getitem__)
                groups.append((at, needing))
        self.step = end
        if not groups:
            return []
        groups.sort(key=_FIRST)
        counts = [(end - at + page_size - 1) // page_size for at, _ in groups]
        pages = sum(map(mul, counts, map(len, map(_SECOND, groups))))
        slots = self.kv.allocator.alloc(pages * page_size)
        if slots is None:
            raise RuntimeError("take_run past steps_in_pool: the pool ran short")
        # Step by step: each group's pages (their indices in ``slots``), in step order.
        taken, given, used = [], [[] for _ in groups], 0
        for cycle in range(counts[0]):
            shift = cycle * page_size
            for (at, needing), count, pages_by_step in zip(groups, counts, given, strict=True):
                if cycle >= count:
                    break
                n = len(needing)
                taken.append((at + shift - start, n * page_size))
                pages_by_step.append(range(used, used + n))
                used += n
        for (at, needing), count, pages_by_step in zip(groups, counts, given, strict=True):
            for req, pages_of_req in zip(needing, zip(*pages_by_step, strict=True), strict=True):
                kv = req._kv_indices
                pending = at - req.kv_run_step  # slots taken in its last page before ``at``
                if pending > 0:
                    last = kv[-1]
                    kv.extend(range(last + 1, last + 1 + pending))
                for page in pages_of_req[:-1]:  # whole pages: the allocator's slot objects
                    kv += slots[page * page_size : (page + 1) * page_size]
                kv.append(slots[pages_of_req[-1] * page_size])
                req.kv_run_step = at + (count - 1) * page_size + 1
            due.setdefault(at + count * page_size, []).extend(needing)
        return taken

    def _needing(self, filed: list[Req], step: int) -> list[Req]:
        """The requests of ``filed`` whose last page is full before ``step``."""
        members, page_size = self._member_set, self.page_size
        return [
            req
            for req in filed
            if req.kv_run is self
            and req in members
            and not (len(req._kv_indices) + step - req.kv_run_step) % page_size
        ]

    def _allocate(self, filed: list[Req], reqs: list[Req]) -> int | None:
        """A new page for each request of ``filed`` (filed for this step) that needs one,
        in batch order: the slots taken, or None (nothing taken) if the pool cannot supply
        them even after evicting from the cache."""
        step, page_size = self.step, self.page_size
        needing = self._needing(filed, step)
        if not needing:
            return 0
        if len(needing) > 1:
            if self._position is None:
                self._position = dict(zip(reqs, range(len(reqs)), strict=True))
            needing.sort(key=self._position.__getitem__)
        kv, slots = self.kv, len(needing) * page_size
        if not kv.ensure_free(slots):
            return None
        pages = kv.allocator.alloc(slots)[::page_size]
        later = self._due.setdefault(step + page_size, [])
        for req, slot in zip(needing, pages, strict=True):
            self.complete(req)
            req._kv_indices.append(slot)
            req.kv_run_step = step + 1
            later.append(req)
        return slots

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
