"""The sliding-window cache's two KV pools: slots for new parts (and what an insert does when
none are left), eviction of full and sliding-window KV, reset and the size counters. Mixed into
``SWARadixCache``."""

from __future__ import annotations

from schedkit.components.cache.allocator import OutOfKVSlotsError
from schedkit.components.cache.cache_params import EvictParams, EvictResult
from schedkit.components.cache.radix_tree import RadixTree
from schedkit.components.cache.swa_tree_node import SWATreeNode, live_slots

__all__ = ["SWAPools"]


class SWAPools:
    """``evict``, ``reset``, the size counters and the slot bookkeeping of ``SWARadixCache``.

    Uses the cache's ``allocator`` and ``swa_allocator``, the tree's eviction order
    (``_evictable_leaves``, ``_evict_key``, ``_nodes``), ``_detach`` and the locking helpers
    (``_lock``, ``_unlock``, ``_lock_swa``); keeps ``_swa_evictable`` as nodes leave.
    """

    __slots__ = ()

    def evict(self, num_tokens: int = 0, swa_num_tokens: int = 0) -> tuple[int, int]:
        """Free at least ``num_tokens`` full and ``swa_num_tokens`` sliding-window tokens.

        Full eviction deletes unlocked leaves in eviction-policy order (``BlockRemoved``) and
        then any tombstoned parents left childless. Sliding-window eviction frees the SWA KV of
        nodes without a sliding-window lock, in the same order: an inner node becomes a
        tombstone (no event); an unlocked leaf is deleted outright (``BlockRemoved``), since a
        tombstone leaf could never be matched. Returns ``(full_evicted, swa_evicted)``; given an
        ``EvictParams``, an ``EvictResult``.
        """
        if type(num_tokens) is EvictParams:
            full, swa = self.evict(num_tokens.num_tokens, num_tokens.swa_num_tokens)
            return EvictResult(num_tokens_evicted=full, swa_num_tokens_evicted=swa)
        if self.disable:
            return 0, 0
        full_evicted = swa_evicted = 0
        if num_tokens > 0:
            for leaf in self._evictable_leaves():
                full, swa = self._delete_leaf(leaf)
                full_evicted += full
                swa_evicted += swa
                if full_evicted >= num_tokens:
                    break
        if swa_evicted < swa_num_tokens:
            key = self._evict_key
            order = sorted(
                (n for n in self._nodes() if n.swa_value is not None and not n.swa_lock_ref),
                key=lambda n: (key(n), n.creation_time),
            )
            for node in order:
                if swa_evicted >= swa_num_tokens:
                    break
                if node.value is None or node.swa_value is None:
                    continue  # deleted with a leaf before it
                if node.children or node.lock_ref:
                    swa_evicted += len(node.key)
                    self.swa_allocator.free(node.swa_value)
                    node.swa_value = None
                    self._swa_evictable -= len(node.key)
                else:
                    full, swa = self._delete_leaf(node)
                    full_evicted += full
                    swa_evicted += swa
        return full_evicted, swa_evicted

    full_evictable_size = RadixTree.evictable_size
    full_protected_size = RadixTree.protected_size

    def swa_evictable_size(self) -> int:
        """Tokens whose sliding-window KV is present and unlocked."""
        return self._swa_evictable

    def swa_protected_size(self) -> int:
        """Tokens whose sliding-window KV is locked."""
        return self._swa_protected

    def swa_total_size(self) -> int:
        """Tokens held with sliding-window KV (tombstones excluded)."""
        return self._swa_evictable + self._swa_protected

    def reset(self) -> None:
        """Drop every entry, free its slots and announce ``AllBlocksCleared`` (events on)."""
        root = SWATreeNode([], [], None, None, self._tick())
        root.swa_value, root.swa_lock_ref = [], 1
        full: list[int] = []
        swa: list[int] = []
        for node in self._clear(root):
            full += node.value
            if node.swa_value is not None:
                swa += node.swa_value
            node.value = node.swa_value = None
        self._free(full, swa)
        self._swa_evictable = self._swa_protected = 0

    def _free(self, full: list[int], swa: list[int | None]) -> None:
        if full:
            self.allocator.free(full)
        live = live_slots(swa)
        if live:
            self.swa_allocator.free(live)

    def _make_room(self, node: SWATreeNode, full_short: int, swa_short: int) -> None:
        """Evict while keeping the node a new leaf hangs from, and its window KV."""
        if full_short <= 0 and swa_short <= 0:
            return
        pin_window = node is not self.root and node.swa_value is not None
        self._lock(node)
        if pin_window:
            self._lock_swa(node, 1)
        try:
            self.evict(max(full_short, 0), max(swa_short, 0))
        finally:
            self._unlock(node)
            if pin_window:
                self._lock_swa(node, -1)

    def _alloc(self, node: SWATreeNode, n: int) -> tuple[list[int], list[int]] | None:
        self._make_room(
            node, n - self.allocator.available_size(), n - self.swa_allocator.available_size()
        )
        if self.allocator.available_size() < n or self.swa_allocator.available_size() < n:
            return None
        return self.allocator.alloc(n), self.swa_allocator.alloc(n)

    def _window_slots(self, node: SWATreeNode, size: int) -> list[int | None]:
        """Sliding-window slots for a new part of ``size`` tokens given full KV only: one per
        token if the pool can supply them (evicting), else live slots for its last window of
        whole pages and None (tombstone) before them, else none at all."""
        page = self.page_size
        self._make_room(node, 0, size - self.swa_allocator.available_size())
        slots = self.swa_allocator.alloc(size)
        if slots is not None:
            return slots
        live = min(size, -(-self.sliding_window_size // page) * page)
        slots = self.swa_allocator.alloc(live)
        if slots is None:
            return [None] * size
        return [None] * (size - live) + slots

    def _insert_failed(self, key: list[int], node: SWATreeNode, size: int, priority: int) -> int:
        tombstone = node.swa_value is None and not node.children and not node.lock_ref
        if node is not self.root and tombstone:
            # Eviction emptied the tombstone the new part would hang from: drop it, start over.
            self._delete_leaf(node)
            return self.insert(key, priority=priority)
        raise OutOfKVSlotsError(
            f"insert needs {size} full and {size} sliding-window KV slots but only "
            f"{self.allocator.available_size()} and {self.swa_allocator.available_size()} "
            "are free after evicting"
        )

    def _delete_leaf(self, leaf: SWATreeNode) -> tuple[int, int]:
        """Delete ``leaf`` and the tombstoned ancestors it leaves childless and unlocked.

        Returns the full and sliding-window tokens freed.
        """
        full = swa = 0
        root = self.root
        while True:
            size = len(leaf.key)
            full += size
            if leaf.swa_value is not None:
                self.swa_allocator.free(leaf.swa_value)
                swa += size
                self._swa_evictable -= size
                leaf.swa_value = None
            parent = self._detach(leaf)
            if parent is root or parent.children or parent.swa_value is not None or parent.lock_ref:
                return full, swa
            leaf = parent
