"""The radix tree both prefix caches are built on, after SGLang's RadixCache.

``RadixTree`` holds what ``RadixCache`` and ``SWARadixCache`` share: nodes keyed by whole pages
(isolated per namespace), the child lookup that splits a node where a key leaves it, attaching
and detaching nodes with their KV events, full-attention locks (lock refs up the path), and a
lazily maintained eviction heap ordered by the eviction policy (SGLang's ``evict_policy``):

- ``lru``: least recently used first; ``lfu``: fewest hits first, then LRU;
- ``fifo``: oldest node first; ``priority``: lowest request priority first, then LRU.

The node bookkeeping, locks and the lazy eviction heap share invariants and stay together
here; sizes and introspection are in ``tree_views``, the generic request caching functions in
``req_caching``, SGLang's ``create_simulated`` in ``sglang_api``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Any

import attrs

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.event_recorder import EventRecorder
from schedkit.components.cache.req_caching import ReqCaching
from schedkit.components.cache.sglang_api import SGLangConstruction
from schedkit.components.cache.tree_arguments import (
    EVICTION_POLICIES,
    known_hash_format,
    known_policy,
    make_pool,
)
from schedkit.components.cache.tree_node import (
    MatchResult,
    RadixKey,
    Tokens,
    TreeNode,
    as_list,
    match_len,
)
from schedkit.components.cache.tree_views import TreeViews
from schedkit.core.component import at_least

__all__ = [
    "EVICTION_POLICIES",
    "MatchResult",
    "RadixKey",
    "RadixTree",
    "TreeNode",
    "make_pool",
    "match_len",
]


def _page_key(key: Tokens, pos: int, page_size: int) -> object:
    """The children-dict key of the page of ``key`` that starts at ``pos``: its token with
    ``page_size`` 1, else the page's tokens as a tuple."""
    if page_size == 1:
        return key[pos]
    if pos == 0 and len(key) == page_size:
        return tuple(key)  # the key is exactly one page: no slice first
    return tuple(key[pos : pos + page_size])


@attrs.define(slots=True, kw_only=True, on_setattr=attrs.setters.NO_OP)
class RadixTree(TreeViews, ReqCaching, SGLangConstruction):
    """The shared tree machinery; not a cache by itself (see ``RadixCache``)."""

    page_size: int = attrs.field(default=1, validator=at_least(1))
    enable_kv_cache_events: bool = False
    allocator: TokenToKVPoolAllocator | None = None
    capacity: int | None = None
    eviction_policy: str = attrs.field(default="lru", validator=known_policy)
    disable: bool = False
    # How namespaced pages publish their hashes: "sglang" (SGLang's default) or "dynamo".
    kv_event_hash_format: str = attrs.field(default="sglang", validator=known_hash_format)

    root: TreeNode | None = attrs.field(init=False, repr=False, default=None)
    _evictable_size: int = attrs.field(init=False, repr=False, default=0)
    _protected_size: int = attrs.field(init=False, repr=False, default=0)
    # Eviction candidates, lazily maintained: (policy key, seq, node) pushed whenever a node
    # becomes an unlocked leaf. An entry is stale when its node has since been locked, got
    # children or left the tree (dropped when popped) or its key grew (pushed again when
    # popped). Keys only grow, so popping yields leaves in policy order.
    _heap: list = attrs.field(init=False, repr=False, factory=list)
    _num_nodes: int = attrs.field(init=False, repr=False, default=0)
    _seq: Callable[[], int] = attrs.field(init=False, repr=False)
    _events: EventRecorder | None = attrs.field(init=False, repr=False, default=None)
    _tick: Callable[[], int] = attrs.field(init=False, repr=False)
    _evict_key: Callable[[TreeNode], object] = attrs.field(init=False, repr=False)

    def _setup(self) -> None:
        """Check the shared arguments and build the pool, recorder and counters."""
        self._evict_key = EVICTION_POLICIES[self.eviction_policy]
        self.allocator = make_pool(self.allocator, self.capacity, self.page_size)
        if self.enable_kv_cache_events:
            self._events = EventRecorder(self.page_size, self.kv_event_hash_format)
        self._tick = itertools.count().__next__
        self._seq = itertools.count().__next__

    def _child(self, node: TreeNode, key: Tokens, pos: int, end: int, namespace: Any):
        """The child of ``node`` that ``key[pos:end]`` enters and how many tokens it matches
        there (whole pages); a child matched only in part is split first. (None, 0) if none.

        ``key`` and the child's key may each be a list or packed (``array('I')``): tokens are
        compared as stored, and converted to ints only where the two differ in kind."""
        page_size = self.page_size
        ckey = _page_key(key, pos, page_size)
        if namespace is not None and node is self.root:
            ckey = (namespace, ckey)
        child = node.children.get(ckey)
        if child is None:
            return None, 0
        stored = child.key
        m = len(stored)
        if m == page_size and pos + m <= end:
            return child, m  # the child's whole key is its dict key: it matched already
        span = key[pos : pos + m]
        if type(span) is not type(stored):
            span, stored = as_list(span), as_list(stored)
        if pos + m > end or span != stored:
            m = match_len(stored, span, 0, page_size)
            child = self._split(child, m)
        return child, m

    def _split(self, child: TreeNode, m: int) -> TreeNode:
        """Cut ``child`` after ``m`` tokens; returns the upper part (``child`` keeps the rest)."""
        value = child.value  # None for a node whose KV left the device (host tier)
        upper = type(child)(
            child.key[:m], None if value is None else value[:m], child.parent, child.namespace, 0
        )
        upper.ckey = child.ckey
        upper.lock_ref = child.lock_ref
        upper.last_access_time = child.last_access_time
        upper.creation_time = child.creation_time
        upper.hit_count = child.hit_count
        upper.priority = child.priority
        if child.digests is not None:
            cut = m // self.page_size
            upper.digests, child.digests = child.digests[: 32 * cut], child.digests[32 * cut :]
            upper.hashes, child.hashes = child.hashes[:cut], child.hashes[cut:]
        self._split_extra(upper, child, m)
        child.ckey = _page_key(child.key, m, self.page_size)
        upper.children[child.ckey] = child
        child.parent.children[upper.ckey] = upper
        child.key = child.key[m:]
        child.value = None if value is None else value[m:]
        child.parent = upper
        child.last_access_time = self._tick()
        self._num_nodes += 1
        return upper

    def _split_extra(self, upper: TreeNode, lower: TreeNode, m: int) -> None:
        """Split what a subclass keeps on its nodes besides the shared fields."""

    def _pack(self, tokens: Tokens) -> bytes | None:
        """The hash input of tokens about to be stored (None with events off); raises
        ValueError for token ids that cannot be hashed, before the cache changes anything."""
        return self._events.pack(tokens) if self._events is not None else None

    def _attach(self, node: TreeNode, raw: bytes | None) -> TreeNode:
        """Hang a new unlocked leaf under ``node.parent`` and announce its pages (``raw`` is
        ``_pack(node.key)``)."""
        parent = node.parent
        key = node.key
        ckey = _page_key(key, 0, self.page_size)
        node.ckey = (node.namespace, ckey) if node.namespace and parent is self.root else ckey
        parent.children[node.ckey] = node
        self._evictable_size += len(key)
        self._num_nodes += 1
        if self._events is not None:
            self._events.stored(node, raw)
        self._push(node)
        return node

    def _detach(self, leaf: TreeNode) -> TreeNode:
        """Take an unlocked leaf out of the tree, free its full KV and withdraw its pages;
        returns its parent."""
        if self._events is not None:
            self._events.removed(leaf)
        self.allocator.free(leaf.value)
        parent = leaf.parent
        del parent.children[leaf.ckey]
        self._evictable_size -= len(leaf.key)
        self._num_nodes -= 1
        leaf.value = None
        if not parent.children and parent.lock_ref == 0:
            self._push(parent)
        return parent

    def _touch_path(self, node: TreeNode | None, priority: int, hit: bool) -> TreeNode:
        """Mark the path from the root to ``node`` (None: the root) as just used, root first,
        as a walk from the root would; returns ``node`` or the root."""
        if node is None:
            return self.root
        path, walk, root = [], node, self.root
        while walk is not root:
            path.append(walk)
            walk = walk.parent
        tick = self._tick
        for walk in reversed(path):
            walk.last_access_time = tick()
            walk.hit_count += hit
            if priority > walk.priority:
                walk.priority = priority
        return node

    def _lock(self, node: TreeNode) -> int:
        """Add a full lock on ``node`` and its ancestors; returns the evictable-size change."""
        delta = 0
        root = self.root
        while node is not root:
            if node.lock_ref == 0:
                delta -= len(node.key)
            node.lock_ref += 1
            node = node.parent
        self._evictable_size += delta
        self._protected_size -= delta
        return delta

    def _unlock(self, node: TreeNode) -> int:
        """Remove one full lock from ``node`` and its ancestors; returns the evictable change."""
        root = self.root
        if node.lock_ref == 1 and not node.children and node is not root:
            self._push(node)  # an unlocked leaf from now on
        delta = 0
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                delta += len(node.key)
            node = node.parent
        self._evictable_size += delta
        self._protected_size -= delta
        return delta

    def _check_lockable(self, node: TreeNode) -> None:
        if node.value is None:
            raise ValueError(
                f"{node!r} is no longer in the cache (evicted or reset); lock a node from a "
                "fresh match_prefix"
            )

    def _check_unlockable(self, node: TreeNode) -> None:
        if node.value is None or node.lock_ref <= 0:
            raise ValueError(f"dec_lock_ref on {node!r}, which holds no lock in this cache")

    def _evictable_leaves(self):
        """Unlocked leaves in eviction-policy order, computed lazily as they are taken."""
        heap, key = self._heap, self._evict_key
        while heap:
            queued, _, leaf = heappop(heap)
            if leaf.value is None or leaf.lock_ref or leaf.children:
                continue  # stale: evicted, locked or no longer a leaf
            if queued != key(leaf):
                self._push(leaf)  # used since it was queued
                continue
            yield leaf

    def _push(self, node: TreeNode) -> None:
        """Queue ``node``, which just became (or still is) an unlocked leaf, for eviction."""
        heap, key = self._heap, self._evict_key
        if len(heap) > 2 * self._num_nodes + 64:
            # Mostly stale entries: rebuild from the tree (amortised over the pushes since).
            heap[:] = [
                (key(n), self._seq(), n) for n in self._nodes() if not n.children and not n.lock_ref
            ]
            heapify(heap)
        heappush(heap, (key(node), self._seq(), node))

    def _nodes(self) -> list[TreeNode]:
        """Every node of the tree but the root."""
        nodes, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes

    def _clear(self, root: TreeNode) -> list[TreeNode]:
        """Replace the tree by ``root`` alone; returns the dropped nodes (values still set)."""
        dropped = self._nodes() if self.root is not None else []
        if self.root is not None:
            self.root.value = None
        root.lock_ref = 1
        if self._events is not None:
            root.digests, root.hashes = b"", []
        self.root = root
        self._evictable_size = self._protected_size = self._num_nodes = 0
        self._heap = []
        if self._events is not None:
            self._events.cleared()
        return dropped
