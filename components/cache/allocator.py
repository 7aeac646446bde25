"""The token-to-KV-pool allocator: hands out and takes back KV-cache slots, a page at a time.

A slot is the integer index of one token's KV entry in the pool. Slots come in pages of
``page_size`` consecutive slots (page ``p`` holds slots ``p * page_size`` to
``p * page_size + page_size - 1``); the allocator tracks pages, like SGLang's paged allocator.
No slot is reserved for padding: every slot from 0 to ``size - 1`` can be handed out.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import floordiv
from typing import Any

import attrs

from schedkit.components.cache.slot_pages import slots_of, whole_pages, whole_pages_py
from schedkit.core.component import ArgumentError, at_least, component

__all__ = ["MAX_POOL_SLOTS", "OutOfKVSlotsError", "TokenToKVPoolAllocator"]

# The largest pool an allocator takes: seven times the largest preset's (qwen2.5-7b on four
# H200s, ~9.0M tokens); the allocator holds a few dozen bytes per slot, so ~2.4 GiB at most.
MAX_POOL_SLOTS = 1 << 26


class OutOfKVSlotsError(RuntimeError):
    """The pool has too few free slots for a request, even after evicting what could be evicted."""


@component("token_to_kv_pool_allocator")
class TokenToKVPoolAllocator:
    """A free list of KV-cache pages.

    ``alloc(n)`` takes whole pages, so ``n`` must be a multiple of ``page_size``. ``free(slots)``
    returns the pages those slots lie on (freeing any slot of a page frees the whole page, as in
    SGLang). Freeing a slot whose page is not allocated, a slot outside the pool, or the same
    slot twice in one call raises ``ValueError`` and leaves the allocator unchanged.

    Allocated pages are kept in a set updated with bulk set operations (``free`` removes its
    pages in one pass and tells a page not allocated or listed twice by the count removed),
    and whole-page slot lists are built and recognised in one call (``slot_pages``: native
    when built, else a list comparison), so ``alloc`` and ``free`` run no Python code per slot
    (other slot lists, such as a trailing partial page, take a per-slot path). The checks that
    say what was wrong with a rejected ``free`` run only when it is rejected.
    """

    size: int = attrs.field(validator=at_least(0))
    page_size: int = attrs.field(default=1, validator=at_least(1))
    _free_pages: list[int] = attrs.field(init=False, repr=False, factory=list)
    _held_pages: set[int] = attrs.field(init=False, repr=False, factory=set)
    # The slots of each page as one tuple per page (page_size > 1): building slot lists from
    # these copies references instead of creating a new int object per slot.
    _page_slots: list[tuple[int, ...]] = attrs.field(init=False, repr=False, factory=list)
    # Page p as one int object (page_size > 1): the free list, the held set and the pages a
    # free recognises share these instead of each making its own.
    _page_ids: list[int] = attrs.field(init=False, repr=False, factory=list)

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too)."""
        if args.size > MAX_POOL_SLOTS:
            raise ArgumentError(
                "size", f"size must be at most {MAX_POOL_SLOTS:,} slots, got {args.size:,}"
            )
        if args.size % args.page_size:
            raise ArgumentError(
                "size",
                f"size must be a non-negative multiple of page_size={args.page_size}, "
                f"got {args.size!r}",
            )

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)
        if self.page_size > 1:
            slots = range(self.size)
            self._page_slots = [
                tuple(slots[i : i + self.page_size]) for i in range(0, self.size, self.page_size)
            ]
            self._page_ids = list(range(self.size // self.page_size))
        self.clear()

    def alloc(self, n: int) -> list[int] | None:
        """``n`` free slots (whole pages, in slot order within each page), or None if too few."""
        page_size = self.page_size
        if n < 0 or n % page_size:
            raise ValueError(
                f"alloc takes a non-negative multiple of page_size={page_size} slots, got {n}"
            )
        num_pages = n // page_size
        free = self._free_pages
        if num_pages > len(free):
            return None
        start = len(free) - num_pages
        pages = free[start:]
        del free[start:]
        pages.reverse()
        self._held_pages.update(pages)
        if page_size == 1:
            return pages
        if num_pages == 1:
            return list(self._page_slots[pages[0]])
        return slots_of(self._page_slots, pages)

    def free(self, indices: Sequence[int]) -> None:
        """Return the pages of ``indices`` to the pool."""
        if not len(indices):
            return
        page_size = self.page_size
        if page_size == 1:
            pages = indices
        else:
            pages = self._pages_of(indices)
            if pages is None:
                raise ValueError(self._free_error(indices))
        held = self._held_pages
        before = len(held)
        try:
            held.difference_update(pages)
        except BaseException:
            self._restore_held()  # an unhashable item: undo what went before it
            raise
        if before - len(held) == len(pages):
            self._free_pages.extend(pages)
            return
        self._restore_held()  # a page not allocated or listed twice: undo
        raise ValueError(self._free_error(indices))

    def available_size(self) -> int:
        """The number of free slots."""
        return len(self._free_pages) * self.page_size

    def clear(self) -> None:
        """Mark every slot free (slots handed out before become invalid)."""
        num_pages = self.size // self.page_size
        # Pages are taken from the end of the list: keep it descending so slot 0 goes first.
        self._free_pages = self._page_ids[::-1] or list(range(num_pages - 1, -1, -1))
        self._held_pages = set()

    def _restore_held(self) -> None:
        """Rebuild the held pages after a rejected ``free``: every page is either on the free
        list or held."""
        free = set(self._free_pages)
        self._held_pages = {p for p in range(self.size // self.page_size) if p not in free}

    def _pages_of(self, indices: Sequence[int]) -> list[int] | None:
        """The distinct pages of ``indices`` in first-seen order; None if a slot is repeated.

        Whole pages listed slot by slot (what ``alloc`` hands out and the caches give back)
        are recognised in one call (``slot_pages.whole_pages``), without a per-slot Python loop.
        """
        page_size = self.page_size
        if isinstance(indices, list) and not len(indices) % page_size:
            pages = whole_pages(indices, self._page_slots, page_size, self._page_ids)
            if pages is None:  # not plain ints: the Python version decides
                pages = whole_pages_py(indices, self._page_slots, page_size)
            if pages:
                return pages  # a repeated page shows up in free's count check
        if isinstance(indices, list):
            # A run of consecutive slots (a request's trailing partial page, say) in one compare.
            first, n = indices[0], len(indices)
            last = indices[-1]
            if last - first == n - 1 and first >= 0 and last < self.size:
                page, offset = divmod(first, page_size)
                if offset + n <= page_size:  # within one page: compare with its slots
                    if indices == list(self._page_slots[page][offset : offset + n]):
                        return [page]
                elif indices == list(range(first, first + n)):
                    return list(range(page, last // page_size + 1))
        if len(set(indices)) != len(indices):
            return None
        return list(dict.fromkeys(map(floordiv, indices, repeat(page_size))))

    def _free_error(self, indices: Sequence[int]) -> str:
        """Why ``free(indices)`` is rejected (called only when it is)."""
        page_size = self.page_size
        distinct = set(indices)
        if len(distinct) != len(indices):
            return f"free got the same slot more than once: {_sample(indices)}"
        if min(distinct) < 0 or max(distinct) >= self.size:
            return (
                f"free got slots outside the pool: valid slots are 0..{self.size - 1}, "
                f"got {_sample(i for i in distinct if not 0 <= i < self.size)}"
            )
        stray = sorted({i // page_size for i in distinct} - self._held_pages)
        return (
            "free got slots that are not allocated (double free or a slot never handed "
            f"out): pages {_sample(stray)} of page_size {page_size}"
        )


def _sample(values, limit: int = 8) -> str:
    values = list(values)
    text = ", ".join(str(v) for v in values[:limit])
    return f"[{text}{', ...' if len(values) > limit else ''}]"
