"""The token-to-KV-pool allocator: hands out and takes back KV-cache slots, a page at a time.

A slot is the integer index of one token's KV entry in the pool. Slots come in pages of
``page_size`` consecutive slots (page ``p`` holds slots ``p * page_size`` to
``p * page_size + page_size - 1``); the allocator tracks pages, like SGLang's paged allocator.
No slot is reserved for padding: every slot from 0 to ``size - 1`` can be handed out.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import attrs

from schedkit.component import component

__all__ = ["OutOfKVSlotsError", "TokenToKVPoolAllocator"]


class OutOfKVSlotsError(RuntimeError):
    """The pool has too few free slots for a request, even after evicting what could be evicted."""


@component("token_to_kv_pool_allocator")
class TokenToKVPoolAllocator:
    """A free list of KV-cache pages.

    ``alloc(n)`` takes whole pages, so ``n`` must be a multiple of ``page_size``. ``free(slots)``
    returns the pages those slots lie on (freeing any slot of a page frees the whole page, as in
    SGLang). Freeing a slot whose page is not allocated, a slot outside the pool, or the same
    slot twice in one call raises ``ValueError`` and leaves the allocator unchanged.
    """

    size: int
    page_size: int = 1
    _free_pages: list[int] = attrs.field(init=False, repr=False, factory=list)
    _held_pages: set[int] = attrs.field(init=False, repr=False, factory=set)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise ValueError(f"page_size must be an integer >= 1, got {self.page_size!r}")
        if not isinstance(self.size, int) or self.size < 0 or self.size % self.page_size:
            raise ValueError(
                f"size must be a non-negative multiple of page_size={self.page_size}, "
                f"got {self.size!r}"
            )
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
        starts = [p * page_size for p in pages]
        return list(chain.from_iterable(map(range, starts, [s + page_size for s in starts])))

    def free(self, indices: Sequence[int]) -> None:
        """Return the pages of ``indices`` to the pool."""
        if not len(indices):
            return
        page_size = self.page_size
        distinct = set(indices)
        if len(distinct) != len(indices):
            raise ValueError(f"free got the same slot more than once: {_sample(indices)}")
        if min(distinct) < 0 or max(distinct) >= self.size:
            raise ValueError(
                f"free got slots outside the pool: valid slots are 0..{self.size - 1}, "
                f"got {_sample(i for i in distinct if not 0 <= i < self.size)}"
            )
        if page_size == 1:
            pages = distinct
            order = indices
        else:
            order = list(dict.fromkeys(i // page_size for i in indices))
            pages = set(order)
        held = self._held_pages
        if not pages <= held:
            stray = sorted(pages - held)
            raise ValueError(
                "free got slots that are not allocated (double free or a slot never handed "
                f"out): pages {_sample(stray)} of page_size {page_size}"
            )
        held -= pages
        self._free_pages.extend(order)

    def available_size(self) -> int:
        """The number of free slots."""
        return len(self._free_pages) * self.page_size

    def clear(self) -> None:
        """Mark every slot free (slots handed out before become invalid)."""
        num_pages = self.size // self.page_size
        # Pages are taken from the end of the list: keep it descending so slot 0 goes first.
        self._free_pages = list(range(num_pages - 1, -1, -1))
        self._held_pages = set()


def _sample(values, limit: int = 8) -> str:
    values = list(values)
    text = ", ".join(str(v) for v in values[:limit])
    return f"[{text}{', ...' if len(values) > limit else ''}]"
