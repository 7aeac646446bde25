"""The gateway's approximate tree, over page hashes: what ``tree.rs``'s own tests check, and
the same answers as a tree of one object per page on random conversations."""

from __future__ import annotations

import heapq
import itertools
import random

from schedkit.kv_events import page_hashes
from schedkit.router.approx_tree import ApproxTree

PAGE = 4


def test_sizes_count_each_tenants_pages_once():
    tree = ApproxTree(PAGE)
    tree.insert([1, 2], 0)
    tree.insert([1, 3], 0)  # shares page 1
    tree.insert([9], 1)
    assert tree.sizes == {0: 3 * PAGE, 1: PAGE}
    assert len(tree) == 4


def test_match_names_a_holder_of_the_deepest_page():
    tree = ApproxTree(PAGE)
    tree.insert([1, 2, 3], 0)
    tree.insert([1, 2], 1)
    assert tree.match([1, 2, 3, 4], frozenset({0, 1})) == (3, 0)
    assert tree.match([1, 2, 7], frozenset({0, 1})) == (2, 0)  # the first still holding it
    assert tree.match([1, 2, 3], frozenset({1})) == (2, 1)  # only live tenants count
    assert tree.match([5], frozenset({0, 1})) == (0, -1)


def test_eviction_takes_least_recently_used_leaves_until_each_tenant_fits():
    tree = ApproxTree(PAGE)
    tree.insert([1, 2], 0)  # oldest leaf: 2
    tree.insert([1, 3], 0)
    tree.insert([4], 0)  # newest
    tree.insert([1, 2], 1)
    tree.evict(max_size=2 * PAGE)
    # Tenant 0 has 4 pages (1, 2, 3, 4) and leaves 2, 3, 4: the oldest leaves go, 2 then 3,
    # until it fits; page 1 (stamped 0, reached on the way) is a leaf now but 2 pages fit.
    assert tree.sizes[0] == 2 * PAGE
    assert tree.match([4], frozenset({0})) == (1, 0)
    assert tree.match([1, 3], frozenset({0})) == (1, 0)
    assert tree.match([1, 2], frozenset({1})) == (2, 1)  # tenant 1 fits: untouched
    tree.evict(max_size=0)
    assert tree.sizes == {0: 0, 1: 0}
    assert len(tree) == 0  # empty nodes leave


def test_remove_tenant_leaves_no_empty_nodes():
    tree = ApproxTree(PAGE)
    tree.insert([1, 2, 3], 0)
    tree.insert([1, 5], 1)
    tree.remove_tenant(0)
    assert 0 not in tree.sizes
    assert len(tree) == 2
    assert tree.match([1, 2, 3], frozenset({0, 1})) == (1, 1)


class _Page:
    __slots__ = ("children", "parent", "tenant_children", "tenants")

    def __init__(self, parent: int | None) -> None:
        self.parent = parent
        self.children: set[int] = set()
        self.tenants: dict[int, int] = {}
        self.tenant_children: dict[int, int] = {}


class PageTree:
    """The gateway's rules read page by page: one object per page, every count kept as it
    changes."""

    def __init__(self, page_size: int) -> None:
        self.page_size, self.nodes, self.sizes = page_size, {}, {}
        self.clock = itertools.count(1)

    def insert(self, hashes: list[int], tenant: int) -> None:
        self.sizes.setdefault(tenant, 0)
        parent, node = None, None
        for h in hashes:
            node = self.nodes.get(h)
            if node is None:
                node = self.nodes[h] = _Page(parent)
                if parent is not None:
                    self.nodes[parent].children.add(h)
            if tenant not in node.tenants:
                node.tenants[tenant] = 0
                self.sizes[tenant] += self.page_size
                if parent is not None:
                    up = self.nodes[parent].tenant_children
                    up[tenant] = up.get(tenant, 0) + 1
            parent = h
        if node is not None:
            node.tenants[tenant] = next(self.clock)

    def match(self, hashes: list[int], tenants: frozenset[int]) -> tuple[int, int]:
        depth, owner = 0, -1
        for i, h in enumerate(hashes, 1):
            node = self.nodes.get(h)
            holder = None if node is None else next((t for t in node.tenants if t in tenants), None)
            if holder is None:
                break
            depth, owner = i, holder
        return depth, owner

    def remove_tenant(self, tenant: int) -> None:
        for h in [h for h, node in self.nodes.items() if tenant in node.tenants]:
            self.drop(h, tenant)
        self.sizes.pop(tenant, None)

    def evict(self, max_size: int) -> None:
        over = {t for t, size in self.sizes.items() if size > max_size}
        heap = [
            (at, h, t)
            for h, node in self.nodes.items()
            for t, at in node.tenants.items()
            if t in over and not node.tenant_children.get(t)
        ]
        heapq.heapify(heap)
        while heap:
            _, h, tenant = heapq.heappop(heap)
            node = self.nodes.get(h)
            if self.sizes.get(tenant, 0) <= max_size or node is None:
                continue
            if tenant not in node.tenants or node.tenant_children.get(tenant):
                continue
            parent = node.parent
            self.drop(h, tenant)
            up = self.nodes.get(parent)
            if up is not None and tenant in up.tenants and not up.tenant_children.get(tenant):
                heapq.heappush(heap, (up.tenants[tenant], parent, tenant))

    def drop(self, h: int, tenant: int) -> None:
        node = self.nodes[h]
        if node.tenants.pop(tenant, None) is None:
            return
        self.sizes[tenant] -= self.page_size
        node.tenant_children.pop(tenant, None)
        parent = self.nodes.get(node.parent)
        if parent is not None:
            count = parent.tenant_children.get(tenant, 0) - 1
            if count > 0:
                parent.tenant_children[tenant] = count
            else:
                parent.tenant_children.pop(tenant, None)
        while not node.tenants and not node.children:
            del self.nodes[h]
            up = node.parent
            if up is None:
                break
            node = self.nodes[up]
            node.children.discard(h)
            h = up


def test_the_tree_answers_as_a_tree_of_one_object_per_page():
    for seed in range(20):
        rng = random.Random(seed)
        tree, pages = ApproxTree(PAGE), PageTree(PAGE)
        talks = [[rng.randrange(40) for _ in range(rng.randrange(40))] for _ in range(5)]
        for _ in range(60):
            roll = rng.random()
            if roll < 0.65:
                k = rng.randrange(len(talks))
                grown = talks[k] + [rng.randrange(40) for _ in range(rng.randrange(30))]
                talks[k] = grown if rng.random() < 0.6 else grown[: rng.randrange(len(grown) + 1)]
                hashes = page_hashes(talks[k], PAGE)
                live = frozenset(rng.sample(range(4), rng.randrange(1, 5)))
                assert tree.match(hashes, live) == pages.match(hashes, live)
                tenant = rng.randrange(4)
                tree.insert(hashes, tenant)
                pages.insert(hashes, tenant)
            elif roll < 0.9:
                size = rng.randrange(150)
                tree.evict(size)
                pages.evict(size)
            else:
                tenant = rng.randrange(4)
                tree.remove_tenant(tenant)
                pages.remove_tenant(tenant)
            assert tree.sizes == pages.sizes and len(tree) == len(pages.nodes)
            for h, node in pages.nodes.items():
                assert tree.match([h], frozenset(node.tenants)) == pages.match(
                    [h], frozenset(node.tenants)
                )
