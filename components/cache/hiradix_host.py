"""The host tier of the host-memory cache: copies to the host pool, host-only leaves dropped
least recently used first when it is full, and the heap that orders them. Mixed into
``HiRadixCache``."""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from schedkit.components.cache.tree_node import TreeNode
from schedkit.kv_events.structs import MEDIUM_CPU

__all__ = ["HostTier"]


class HostTier:
    """``write_backup``, ``evict_host`` and ``host_used_size`` of ``HiRadixCache``.

    Uses the cache's ``host_allocator``, ``root``, event recorder (``_events``), node count
    (``_num_nodes``, ``_nodes``) and sequence (``_seq``); keeps the host-only leaves' heap
    (``_host_heap``) and ``backed_up_tokens``.
    """

    __slots__ = ()

    def host_used_size(self) -> int:
        """Tokens held in the host pool."""
        return self.host_allocator.size - self.host_allocator.available_size()

    def write_backup(self, node: TreeNode) -> int:
        """Copy ``node``'s device KV to the host pool (evicting host-only leaves if it is
        full); returns the tokens copied, 0 if the host pool cannot hold them."""
        n = len(node.value)
        host = self.host_allocator.alloc(n)
        if host is None:
            self.evict_host(n - self.host_allocator.available_size())
            host = self.host_allocator.alloc(n)
            if host is None:
                return 0
        node.host_value = host
        self.backed_up_tokens += n
        if self._events is not None:
            self._events.announce(node, MEDIUM_CPU)
        return n

    def evict_host(self, num_tokens: int) -> int:
        """Drop host-only leaves not protected by ``protect_host``, least recently used
        first, until ``num_tokens`` host slots are freed; returns the tokens freed."""
        heap, evicted, held = self._host_heap, 0, []
        while heap and evicted < num_tokens:
            queued, _, node = heappop(heap)
            if node.host_value is None or node.value is not None or node.children:
                continue  # stale: dropped, back on the device, or not a leaf
            if queued != node.last_access_time:
                self._push_host(node)
                continue
            if node.host_ref_counter:
                held.append(node)
                continue
            evicted += self._drop_host(node)
        for node in held:
            self._push_host(node)
        return evicted

    def _drop_host_subtree(self, node: TreeNode) -> None:
        for child in list(node.children.values()):
            self._drop_host_subtree(child)
        self._drop_host(node)

    def _drop_host(self, node: TreeNode) -> int:
        """Take a host-only leaf out of the tree and free its host slots."""
        n = len(node.host_value)
        if self._events is not None:
            self._events.removed(node, MEDIUM_CPU)
        self.host_allocator.free(node.host_value)
        node.host_value = None
        parent = node.parent
        del parent.children[node.ckey]
        self._num_nodes -= 1
        if parent is not self.root and parent.value is None and not parent.children:
            self._push_host(parent)
        return n

    def _push_host(self, node: TreeNode) -> None:
        heap = self._host_heap
        if len(heap) > 2 * self._num_nodes + 64:
            heap[:] = [
                (n.last_access_time, self._seq(), n)
                for n in self._nodes()
                if n.value is None and n.host_value is not None and not n.children
            ]
            heapify(heap)
        heappush(heap, (node.last_access_time, self._seq(), node))
