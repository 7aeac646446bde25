"""Device eviction in the host-memory cache: a device leaf with a host copy stays in the tree
as host-only, one without leaves it (with write-back, after a copy to the host if there is
room); the device heap counts a node whose children are all host-only as a leaf. Mixed into
``HiRadixCache``."""

from __future__ import annotations

from collections.abc import Iterator
from heapq import heapify, heappop, heappush

from schedkit.components.cache.cache_params import EvictParams, EvictResult
from schedkit.components.cache.radix_tree import RadixTree
from schedkit.components.cache.tree_node import TreeNode
from schedkit.kv_events.structs import MEDIUM_GPU

__all__ = ["DeviceEviction"]


class DeviceEviction:
    """``evict`` and the device eviction heap of ``HiRadixCache``.

    Uses the cache's ``allocator``, ``hicache_write_policy``, event recorder (``_events``),
    the tree's heap and counters (``_heap``, ``_evict_key``, ``_seq``, ``_num_nodes``,
    ``_evictable_size``) and the host tier (``write_backup``, ``_push_host``,
    ``_drop_host_subtree``).
    """

    __slots__ = ()

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` device slots from unlocked device leaves, LRU first (by
        ``eviction_policy``): a node with a host copy stays in the tree as host-only, one
        without (write-back: after copying it to the host if there is room) leaves it.
        Returns the tokens evicted; given an ``EvictParams``, an ``EvictResult``."""
        if type(num_tokens) is EvictParams:
            return EvictResult(num_tokens_evicted=self.evict(num_tokens.num_tokens))
        if self.disable or num_tokens <= 0:
            return 0
        evicted = 0
        write_back = self.hicache_write_policy == "write_back"
        for leaf in self._evictable_leaves():
            if write_back and leaf.host_value is None:
                self.write_backup(leaf)
            if leaf.host_value is not None:
                evicted += self._evict_backuped(leaf)
            else:
                evicted += self._evict_regular(leaf)
            if evicted >= num_tokens:
                break
        return evicted

    def _evict_backuped(self, leaf: TreeNode) -> int:
        """Free a device leaf's slots, keeping it in the tree with its host copy."""
        n = len(leaf.value)
        if self._events is not None:
            self._events.removed(leaf, MEDIUM_GPU)
        self.allocator.free(leaf.value)
        leaf.value = None
        self._evictable_size -= n
        if not leaf.children:
            self._push_host(leaf)
        self._push_if_device_leaf(leaf.parent)
        return n

    def _evict_regular(self, leaf: TreeNode) -> int:
        """Take a device leaf without a host copy out of the tree (its host-only subtree
        too)."""
        n = len(leaf.value)
        for child in list(leaf.children.values()):
            self._drop_host_subtree(child)
        parent = self._detach(leaf)
        self._push_if_device_leaf(parent)
        return n

    def _is_device_leaf(self, node: TreeNode) -> bool:
        if node.value is None or node is self.root:
            return False
        return all(child.value is None for child in node.children.values())

    def _push_if_device_leaf(self, node: TreeNode) -> None:
        if node.lock_ref == 0 and self._is_device_leaf(node):
            self._push(node)

    def _push(self, node: TreeNode) -> None:
        heap, key = self._heap, self._evict_key
        if len(heap) > 2 * self._num_nodes + 64:
            heap[:] = [
                (key(n), self._seq(), n)
                for n in self._nodes()
                if not n.lock_ref and self._is_device_leaf(n)
            ]
            heapify(heap)
        heappush(heap, (key(node), self._seq(), node))

    def _unlock(self, node: TreeNode) -> int:
        if node is not self.root and node.lock_ref == 1 and node.children:  # noqa: SIM102
            if self._is_device_leaf(node):
                self._push(node)  # its children are host-only: a device leaf from now on
        return RadixTree._unlock(self, node)

    def _evictable_leaves(self) -> Iterator[TreeNode]:
        heap, key = self._heap, self._evict_key
        while heap:
            queued, _, leaf = heappop(heap)
            if leaf.value is None or leaf.lock_ref or not self._is_device_leaf(leaf):
                continue
            if queued != key(leaf):
                self._push(leaf)
                continue
            yield leaf
