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

A prompt's pages are its hashes in order, so an insert is the pages already in the tree (a
path from the root) followed by new ones: both are recorded a prompt at a time, and a match
is one walk along the hashes. A node only one tenant reached and nothing stamped shares one
immutable tenant set with every such node of that tenant (no container of its own); which
nodes are a tenant's leaves, and how many children a node has, is worked out when an
eviction or a removal needs it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from itertools import compress, repeat
from operator import contains, not_

from schedkit.kv_events.index import first_missing

__all__ = ["ApproxTree"]

# A node's tenants: tenant -> last access in the order they reached it, or, for a node one
# tenant reached and nothing stamped, that tenant's shared one-tenant set (access 0).
_Tenants = dict[int, int] | frozenset[int]


def _accesses(held: _Tenants) -> Iterable[tuple[int, int]]:
    """A node's (tenant, last access) pairs, in the order the tenants reached it."""
    return held.items() if type(held) is dict else [(t, 0) for t in held]


class ApproxTree:
    """Page hash -> node, with per-tenant sizes in tokens (see the module docstring).

    A node is its hash in ``_parent`` (the page before it, None for a first page) and in
    ``_tenants`` (``_Tenants``)."""

    __slots__ = ("_chained", "_clock", "_parent", "_solo", "_tenants", "page_size", "sizes")

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._parent: dict[int, int | None] = {}
        self._tenants: dict[int, _Tenants] = {}
        self._solo: dict[int, frozenset[int]] = {}
        self.sizes: dict[int, int] = {}
        self._clock = itertools.count(1)
        self._chained = True  # every insert was a path from the root, each page once

    def __len__(self) -> int:
        return len(self._parent)

    def _own(self, h: int) -> dict[int, int]:
        """Node ``h``'s tenants as a dict of its own, to change."""
        held = self._tenants[h]
        if type(held) is not dict:
            held = self._tenants[h] = dict.fromkeys(held, 0)
        return held

    def insert(self, hashes: list[int], tenant: int) -> None:
        """Record that ``tenant`` was sent the prompt whose page hashes are ``hashes``."""
        self.sizes.setdefault(tenant, 0)
        if not hashes:
            return
        solo = self._solo.get(tenant)
        if solo is None:
            solo = self._solo[tenant] = frozenset((tenant,))
        tenants, parents = self._tenants, self._parent
        known = first_missing(parents, hashes)
        new = hashes[known:]
        if len(set(hashes)) < len(hashes) or not parents.keys().isdisjoint(new):
            self._insert_page_by_page(hashes, tenant, solo)
        else:
            old = hashes[:known]
            held = map(contains, map(tenants.__getitem__, old), repeat(tenant))
            reached = list(compress(old, map(not_, held)))
            for h in reached:
                self._own(h)[tenant] = 0
            if new:
                above = old[-1] if old else None
                parents.update(zip(new, [above, *new[:-1]], strict=True))
                tenants.update(zip(new, repeat(solo, len(new)), strict=True))
            self.sizes[tenant] += self.page_size * (len(reached) + len(new))
        self._own(hashes[-1])[tenant] = next(self._clock)

    def _insert_page_by_page(self, hashes: list[int], tenant: int, solo: frozenset[int]) -> None:
        """``insert`` for a hash list with a page twice, or a new page before a known one
        (never a prompt's page hashes); the last page is stamped by the caller."""
        self._chained = False
        tenants, parents = self._tenants, self._parent
        parent: int | None = None
        for h in hashes:
            held = tenants.get(h)
            if held is None:
                tenants[h], parents[h] = solo, parent
                self.sizes[tenant] += self.page_size
            elif tenant not in held:
                self._own(h)[tenant] = 0
                self.sizes[tenant] += self.page_size
            parent = h

    def match(self, hashes: list[int], tenants: set[int] | frozenset[int]) -> tuple[int, int]:
        """The pages of the deepest node on ``hashes``'s path held by one of ``tenants``, and
        that tenant (-1 when no page matches)."""
        nodes = self._tenants
        if self._chained and self.sizes.keys() <= tenants:  # each node's first tenant counts
            depth = first_missing(nodes, hashes)
            return depth, next(iter(nodes[hashes[depth - 1]])) if depth else -1
        depth, owner = 0, -1
        for i, h in enumerate(hashes, 1):
            held = nodes.get(h)
            if held is None:
                break
            holder = next((t for t in held if t in tenants), None)
            if holder is None:
                break
            depth, owner = i, holder
        return depth, owner

    def remove_tenant(self, tenant: int) -> None:
        """Forget every node of ``tenant`` (a worker that left)."""
        children, _ = self._below(with_tenants=False)
        for h in [h for h, held in self._tenants.items() if tenant in held]:
            self._drop(h, tenant, children, None)
        self.sizes.pop(tenant, None)
        self._solo.pop(tenant, None)

    def _below(self, with_tenants: bool) -> tuple[dict[int, int], dict[int, dict[int, int]]]:
        """How many children each node with children has and, ``with_tenants``, how many of
        them hold each tenant."""
        children: dict[int, int] = {}
        below: dict[int, dict[int, int]] = {}
        tenants = self._tenants
        for h, parent in self._parent.items():
            if parent is None:
                continue
            children[parent] = children.get(parent, 0) + 1
            if with_tenants:
                up = below.get(parent)
                if up is None:
                    up = below[parent] = {}
                for tenant in tenants[h]:
                    up[tenant] = up.get(tenant, 0) + 1
        return children, below

    def evict(self, max_size: int) -> None:
        """Each tenant over ``max_size`` tokens loses its least recently used leaves until it
        fits (``Tree::evict_tenant_by_size``)."""
        over = {t for t, size in self.sizes.items() if size > max_size}
        if not over:
            return
        children, below = self._below(with_tenants=True)
        none: dict[int, int] = {}
        heap = []
        for h, held in self._tenants.items():
            for tenant, at in _accesses(held):
                if tenant in over and not below.get(h, none).get(tenant):
                    heap.append((at, h, tenant))
        heapq.heapify(heap)
        while heap:
            _, h, tenant = heapq.heappop(heap)
            if self.sizes.get(tenant, 0) <= max_size:
                continue
            held = self._tenants.get(h)
            if held is None or tenant not in held or below.get(h, none).get(tenant):
                continue
            parent = self._parent[h]
            self._drop(h, tenant, children, below)
            up = self._tenants.get(parent) if parent is not None else None
            if up is not None and tenant in up and not below.get(parent, none).get(tenant):
                at = up[tenant] if type(up) is dict else 0
                heapq.heappush(heap, (at, parent, tenant))

    def _drop(
        self,
        h: int,
        tenant: int,
        children: dict[int, int],
        below: dict[int, dict[int, int]] | None,
    ) -> None:
        """Take ``tenant`` off node ``h``, keeping ``children`` (and ``below``, the tenant
        children counts, when an eviction uses them); nodes left with no tenant and no child
        leave, upwards."""
        if tenant not in self._tenants[h]:
            return
        held = self._own(h)
        del held[tenant]
        self.sizes[tenant] -= self.page_size
        parent = self._parent[h]
        if below is not None:
            below.get(h, {}).pop(tenant, None)
            up = below.get(parent) if parent is not None else None
            if up is not None:
                count = up.get(tenant, 0) - 1
                if count > 0:
                    up[tenant] = count
                else:
                    up.pop(tenant, None)
        while not held and not children.get(h):  # empty nodes leave, upwards
            del self._tenants[h], self._parent[h]
            children.pop(h, None)
            if below is not None:
                below.pop(h, None)
            if parent is None:
                break
            children[parent] -= 1
            h, held, parent = parent, self._tenants[parent], self._parent[parent]
