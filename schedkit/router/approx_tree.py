"""The SGLang model gateway's approximate per-worker prefix tree
(``sgl-model-gateway/src/policies/tree.rs``), over page hashes instead of characters.

The gateway never asks a worker what it caches: when it routes a request it inserts the
request's text into one tree shared by all workers, marking every node on the path with that
worker (the "tenant") and the last node with an access time; a match walks the tree as deep
as the prompt goes and names a tenant of the deepest node; every ``eviction_interval`` seconds
each tenant whose size is over ``max_tree_size`` loses its least recently used leaves until it
fits. Here a node is one page of ``page_size`` tokens, named by its chained page hash (so a
node's path is its prefix), and sizes count tokens.

As in the gateway, a node first reached by a tenant on the way to a deeper one gets access time
0 (only the last node of an insert is stamped), so such nodes go first once they become leaves;
the tenant named for a node is the first still holding it (the gateway caches the tenant that
created the node). Bounded by ``max_tree_size`` per tenant at each eviction.
"""

from __future__ import annotations

import heapq
import itertools

__all__ = ["ApproxTree"]


class _Node:
    __slots__ = ("children", "parent", "tenant_children", "tenants")

    def __init__(self, parent: int | None) -> None:
        self.parent = parent
        self.children: set[int] = set()
        self.tenants: dict[int, int] = {}  # tenant -> last access (insertion order kept)
        self.tenant_children: dict[int, int] = {}  # tenant -> children holding it


class ApproxTree:
    """Page hash -> node, with per-tenant sizes in tokens (see the module docstring)."""

    __slots__ = ("_clock", "_nodes", "page_size", "sizes")

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._nodes: dict[int, _Node] = {}
        self.sizes: dict[int, int] = {}
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return len(self._nodes)

    def insert(self, hashes: list[int], tenant: int) -> None:
        """Record that ``tenant`` was sent the prompt whose page hashes are ``hashes``."""
        nodes, page = self._nodes, self.page_size
        self.sizes.setdefault(tenant, 0)
        parent: int | None = None
        node = None
        for h in hashes:
            node = nodes.get(h)
            if node is None:
                node = nodes[h] = _Node(parent)
                if parent is not None:
                    nodes[parent].children.add(h)
            if tenant not in node.tenants:
                node.tenants[tenant] = 0
                self.sizes[tenant] += page
                if parent is not None:
                    up = nodes[parent].tenant_children
                    up[tenant] = up.get(tenant, 0) + 1
            parent = h
        if node is not None:
            node.tenants[tenant] = next(self._clock)

    def match(self, hashes: list[int], tenants: set[int] | frozenset[int]) -> tuple[int, int]:
        """The pages of the deepest node on ``hashes``'s path held by one of ``tenants``, and
        that tenant (-1 when no page matches)."""
        nodes = self._nodes
        depth, owner = 0, -1
        for i, h in enumerate(hashes, 1):
            node = nodes.get(h)
            if node is None:
                break
            holder = next((t for t in node.tenants if t in tenants), None)
            if holder is None:
                break
            depth, owner = i, holder
        return depth, owner

    def remove_tenant(self, tenant: int) -> None:
        """Forget every node of ``tenant`` (a worker that left)."""
        for h in [h for h, node in self._nodes.items() if tenant in node.tenants]:
            self._drop(h, tenant)
        self.sizes.pop(tenant, None)

    def evict(self, max_size: int) -> None:
        """Each tenant over ``max_size`` tokens loses its least recently used leaves until it
        fits (``Tree::evict_tenant_by_size``)."""
        over = {t for t, size in self.sizes.items() if size > max_size}
        if not over:
            return
        heap = []
        for h, node in self._nodes.items():
            for tenant, at in node.tenants.items():
                if tenant in over and not node.tenant_children.get(tenant):
                    heap.append((at, h, tenant))
        heapq.heapify(heap)
        while heap:
            _, h, tenant = heapq.heappop(heap)
            if self.sizes.get(tenant, 0) <= max_size:
                continue
            node = self._nodes.get(h)
            if node is None or tenant not in node.tenants or node.tenant_children.get(tenant):
                continue
            parent = node.parent
            self._drop(h, tenant)
            up = self._nodes.get(parent) if parent is not None else None
            if up is not None and tenant in up.tenants and not up.tenant_children.get(tenant):
                heapq.heappush(heap, (up.tenants[tenant], parent, tenant))

    def _drop(self, h: int, tenant: int) -> None:
        node = self._nodes[h]
        if node.tenants.pop(tenant, None) is None:
            return
        self.sizes[tenant] -= self.page_size
        node.tenant_children.pop(tenant, None)
        parent = self._nodes.get(node.parent) if node.parent is not None else None
        if parent is not None:
            count = parent.tenant_children.get(tenant, 0) - 1
            if count > 0:
                parent.tenant_children[tenant] = count
            else:
                parent.tenant_children.pop(tenant, None)
        while not node.tenants and not node.children:  # empty nodes leave, upwards
            del self._nodes[h]
            up = node.parent
            if up is None:
                break
            node = self._nodes[up]
            node.children.discard(h)
            h = up
