"""One scheduler's KV slots: the allocator's pool plus what the prefix cache may evict, taken
and given back a request at a time."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from schedkit.components.cache.req_locks import unlock_req
from schedkit.components.scheduler.decode_pages import DecodePages
from schedkit.core.protocols import KVAllocator, PrefixCache
from schedkit.core.schedule_batch import Req

__all__ = ["KVSlots"]


@attrs.define(slots=True)
class KVSlots:
    """The allocator and prefix cache of one scheduler, with the operations admission and
    decoding share. A request holds one slot per token that has KV (``req.kv_indices``): its
    cached prefix first (``req.prefix_len`` slots, the cache's, locked through
    ``req.last_node``), then the slots it computed itself."""

    allocator: KVAllocator
    tree_cache: PrefixCache
    page_size: int
    # With pages of several slots, decode steps take their slots through this (see
    # ``decode_pages``); with single-slot pages every step allocates for every request.
    decode_pages: DecodePages | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self.page_size > 1:
            self.decode_pages = DecodePages(self)

    def room(self) -> int:
        """Slots free now or once the cache evicts what it may."""
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    def ensure_free(self, n: int) -> bool:
        """Make ``n`` slots free, evicting from the cache if needed; True if they are free."""
        shortfall = n - self.allocator.available_size()
        if shortfall > 0:
            self.tree_cache.evict(shortfall)
            return self.allocator.available_size() >= n
        return True

    def decode_need(self, reqs: Iterable[Req]) -> int:
        """Slots a decode step over ``reqs`` takes from the pool (whole pages)."""
        page_size = self.page_size
        if page_size == 1:
            return len(list(reqs))
        return page_size * [len(r.kv_indices) % page_size for r in reqs].count(0)

    def extend(self, req: Req, n: int) -> bool:
        """Append ``n`` KV slots to ``req.kv_indices``, filling its last page first; False
        (and nothing taken) if the pool cannot supply them."""
        kv, page_size = req.kv_indices, self.page_size
        in_page = min(n, -len(kv) % page_size)
        rest = n - in_page
        pages = -(-rest // page_size)
        if not self.ensure_free(pages * page_size):
            return False
        slots = self.allocator.alloc(pages * page_size)
        if in_page:
            kv.extend(range(kv[-1] + 1, kv[-1] + 1 + in_page))
        kv.extend(slots if rest == len(slots) else slots[:rest])
        return True

    def release(self, req: Req) -> None:
        """Free the slots the request computed itself and unlock its cached prefix (which
        the cache keeps); nothing of the request is inserted into the cache."""
        own = req.kv_indices[req.prefix_len :]
        if own:
            self.allocator.free(own)
        unlock_req(self.tree_cache, req)
        req.kv_indices = []
        req.last_node = None
        req.swa_uuid_for_lock = None
