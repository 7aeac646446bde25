"""The radix prefix cache: token prefixes and their KV slots in a radix tree, after SGLang's
RadixCache, with KV-cache events for KV-aware routers.

KV slots are plain ints handed out by a ``TokenToKVPoolAllocator``. Ownership rules:

- ``insert(key, value)`` takes ownership of every slot in ``value``. Slots for tokens the cache
  already holds are freed, except those that already are the cache's own slot at that position
  (a prefix obtained from ``match_prefix``); the slots of a trailing partial page (page_size > 1)
  are freed too. The slots of the newly stored part belong to the cache from then on.
- ``insert(key)`` without a value takes slots for the new part from the cache's allocator,
  evicting least-recently-used unlocked entries if the pool is short.
- ``evict`` and ``reset`` give the cache's slots back to the allocator.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from heapq import heapify, heappop, heappush
from typing import Any

import attrs
from schedkit.components._event_recorder import EventRecorder
from schedkit.components.allocator import OutOfKVSlotsError, TokenToKVPoolAllocator
from schedkit.components.eviction_policy import EVICTION_POLICIES, EvictionPolicy

from schedkit.component import at_least, component

__all__ = ["MatchResult", "RadixCache", "RadixKey", "TreeNode"]


class RadixKey(list):
    """Token ids in a namespace: requests whose keys differ in ``extra_key`` or ``cache_salt``
    never share cached KV, and their published page hashes are namespaced (see
    ``schedkit.kv_events.hashing``). A plain list is the key of the default namespace.
    ``priority`` (the request's) raises the nodes' priority for the ``priority`` eviction
    policy."""

    __slots__ = ("cache_salt", "extra_key", "priority")

    def __init__(
        self,
        token_ids: Sequence[int],
        extra_key: str | None = None,
        cache_salt: str | None = None,
        priority: int | None = None,
    ) -> None:
        super().__init__(token_ids)
        self.extra_key = extra_key
        self.cache_salt = cache_salt
        self.priority = priority

    @property
    def namespace(self) -> tuple[str | None, str | None] | None:
        """``(extra_key, cache_salt)``, or None for the default namespace."""
        if self.extra_key is None and self.cache_salt is None:
            return None
        return (self.extra_key, self.cache_salt)


class TreeNode:
    """One edge of the radix tree: a run of whole pages of tokens and their KV slots.

    ``digests`` holds the pages' 32-byte hash-chain digests and ``hashes`` the hashes events
    carry for them (both None when events are off); the last digest is what a child's first
    page chains from. ``value`` is None once the node has left the tree (evicted, or dropped
    by ``reset``). A root (one per namespace) has no parent. ``created``, ``hit_count`` and
    ``priority`` feed the eviction policies (``schedkit.components.eviction_policy``).
    """

    __slots__ = (
        "children",
        "created",
        "digests",
        "hashes",
        "hit_count",
        "key",
        "last_access_time",
        "lock_ref",
        "parent",
        "priority",
        "value",
    )

    def __init__(
        self,
        key: list[int],
        value: list[int],
        parent: TreeNode | None,
        digests: list[bytes] | None,
        last_access_time: int,
        hashes: list[int] | None = None,
    ) -> None:
        self.key = key
        self.value: list[int] | None = value
        self.parent = parent
        self.digests = digests
        self.hashes = hashes
        self.created = last_access_time
        self.hit_count = 0
        self.priority = 0
        self.last_access_time = last_access_time
        self.children: dict = {}
        self.lock_ref = 0

    @property
    def evicted(self) -> bool:
        """True once the node is no longer part of its cache."""
        return self.value is None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key[:8]}{'...' if len(self.key) > 8 else ''})"


@attrs.frozen
class MatchResult:
    """The longest cached prefix of a key: its KV slots and the tree node that ends it.

    ``swa_indices`` is set by the sliding-window cache only: one sliding-window slot per
    matched token, None where that token's sliding-window KV was evicted.
    """

    device_indices: list[int]
    last_node: TreeNode
    swa_indices: list[int | None] | None = None

    @property
    def prefix_len(self) -> int:
        """The number of matched tokens."""
        return len(self.device_indices)


def child_key_fn(page_size: int) -> Callable[[list[int], int], object]:
    """The function giving the child-dict key of the page starting at ``key[pos]``."""
    if page_size == 1:
        return lambda key, pos: key[pos]
    return lambda key, pos: tuple(key[pos : pos + page_size])


def match_len(node_key: list[int], key: list[int], pos: int, page_size: int) -> int:
    """How many leading tokens of ``node_key`` equal ``key[pos:]``, in whole pages."""
    n = min(len(node_key), len(key) - pos)
    if node_key[:n] == key[pos : pos + n]:
        return n - n % page_size
    # Bisect for the first difference with slice comparisons (C loops), not token by token:
    # the first ``lo`` tokens are equal and the first ``hi`` are not.
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if node_key[lo:mid] == key[pos + lo : pos + mid]:
            lo = mid
        else:
            hi = mid
    return lo - lo % page_size


def make_pool(
    allocator: TokenToKVPoolAllocator | None,
    capacity: int | None,
    page_size: int,
    names: tuple[str, str] = ("allocator", "capacity"),
) -> TokenToKVPoolAllocator:
    """The pool a cache frees into: the given allocator, or a new one of ``capacity`` slots."""
    allocator_name, capacity_name = names
    if allocator is None:
        if capacity is None:
            raise ValueError(
                f"the cache needs a KV pool: pass {allocator_name}=TokenToKVPoolAllocator(...) "
                f"or {capacity_name}=<number of token slots>"
            )
        return TokenToKVPoolAllocator(size=capacity, page_size=page_size)
    if capacity is not None:
        raise ValueError(f"pass either {allocator_name}= or {capacity_name}=, not both")
    if allocator.page_size != page_size:
        raise ValueError(
            f"{allocator_name}.page_size is {allocator.page_size} but the cache's page_size "
            f"is {page_size}; they must match"
        )
    return allocator


@component("radix_cache")
class RadixCache:
    """Prefix cache over a radix tree with LRU eviction of unlocked leaves.

    With ``page_size > 1`` keys are matched and stored in whole pages and nodes split only at
    page boundaries. With ``enable_kv_cache_events`` every stored page is announced
    (``BlockStored``), every evicted node withdrawn (``BlockRemoved``) and ``reset`` (run by
    the constructor too) announces ``AllBlocksCleared``. A ``RadixKey`` key lives in its own
    namespace: a tree of its own under a root of its own, with namespaced page hashes.
    With ``disable`` nothing is cached: matches are empty and inserted slots are freed.
    """

    page_size: int = attrs.field(default=1, validator=at_least(1))
    enable_kv_cache_events: bool = False
    allocator: TokenToKVPoolAllocator | None = None
    capacity: int | None = None
    disable: bool = False
    eviction_policy: EvictionPolicy = attrs.field(
        default="lru", validator=attrs.validators.in_(EVICTION_POLICIES)
    )

    root: TreeNode | None = attrs.field(init=False, repr=False, default=None)
    # The roots of the namespaced trees, by (extra_key, cache_salt).
    _namespace_roots: dict = attrs.field(init=False, repr=False, factory=dict)
    _evictable_size: int = attrs.field(init=False, repr=False, default=0)
    _protected_size: int = attrs.field(init=False, repr=False, default=0)
    # Eviction candidates, lazily maintained: (policy key, seq, node) pushed whenever a node
    # becomes an unlocked leaf. An entry is stale when its node has since been locked, got
    # children or left the tree (dropped when popped) or its key changed, by use (pushed
    # again with its new key when popped). Keys only grow, so every unlocked leaf has an
    # entry no larger than its key, and popping yields leaves in the policy's order.
    _heap: list[tuple[Any, int, TreeNode]] = attrs.field(init=False, repr=False, factory=list)
    _evict_key: Callable[[TreeNode], Any] = attrs.field(init=False, repr=False)
    _num_nodes: int = attrs.field(init=False, repr=False, default=0)
    _seq: Callable[[], int] = attrs.field(init=False, repr=False)
    _events: EventRecorder | None = attrs.field(init=False, repr=False, default=None)
    _tick: Callable[[], int] = attrs.field(init=False, repr=False)
    _child_key: Callable[[list[int], int], object] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self.allocator = make_pool(self.allocator, self.capacity, self.page_size)
        if self.enable_kv_cache_events:
            self._events = EventRecorder(self.page_size)
        self._tick = itertools.count().__next__
        self._seq = itertools.count().__next__
        self._child_key = child_key_fn(self.page_size)
        self._evict_key = EVICTION_POLICIES[self.eviction_policy]
        self.reset()

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """The longest cached whole-page prefix of ``key``; marks its nodes as just used.

        A match ending inside a node splits that node so that ``last_node`` ends exactly at
        the match (splitting emits no event).
        """
        node = self.root
        if self.disable:
            return MatchResult([], node)
        if type(key) is not list:
            if type(key) is RadixKey and key.namespace is not None:
                node = self._namespace_roots.get(key.namespace, node)
                if node is self.root:
                    return MatchResult([], node)
            else:
                key = list(key)
        page_size, tick, child_key = self.page_size, self._tick, self._child_key
        end = len(key) - len(key) % page_size
        pos = 0
        indices: list[int] = []
        while pos < end:
            child = node.children.get(child_key(key, pos))
            if child is None:
                break
            node_key = child.key
            m = len(node_key)
            if key[pos : pos + m] != node_key:
                m = match_len(node_key, key, pos, page_size)
                child = self._split(child, m)
            child.last_access_time = tick()
            child.hit_count += 1
            indices += child.value
            node = child
            pos += m
        return MatchResult(indices, node)

    def insert(self, key: Sequence[int], value: Sequence[int] | None = None) -> int:
        """Store ``key`` with its KV slots; returns how many leading tokens were already cached.

        ``value`` holds one slot per token of ``key`` (see the module docstring for who owns
        what afterwards); without it the cache allocates slots for the new part, evicting if
        needed, and raises ``OutOfKVSlotsError`` if the pool cannot supply them.
        """
        root = self.root
        if type(key) is not list:
            if type(key) is RadixKey:
                if key.namespace is not None:
                    root = self._namespace_root(key.namespace)
            else:
                key = list(key)
        if value is not None:
            if type(value) is not list:
                value = list(value)
            if len(value) != len(key):
                raise ValueError(
                    f"value has {len(value)} slots for {len(key)} tokens; give one slot per token"
                )
        if self.disable:
            if value:
                self.allocator.free(value)
            return 0
        page_size, tick, child_key = self.page_size, self._tick, self._child_key
        end = len(key) - len(key) % page_size
        to_free = value[end:] if value is not None else []
        priority = key.priority if type(key) is RadixKey and key.priority is not None else None
        node, pos = root, 0
        while pos < end:
            child = node.children.get(child_key(key, pos))
            if child is None:
                break
            m = len(child.key)
            if pos + m > end or key[pos : pos + m] != child.key:
                m = match_len(child.key, key, pos, page_size)
                child = self._split(child, m)
            child.last_access_time = tick()
            if priority is not None and priority > child.priority:
                child.priority = priority
            if value is not None:
                given = value[pos : pos + m]
                if given != child.value:
                    to_free += [v for v, own in zip(given, child.value, strict=True) if v != own]
            node = child
            pos += m
        if pos < end:
            new_key = key[pos:end]
            new_value = value[pos:end] if value is not None else self._alloc(node, end - pos)
            if to_free:
                self.allocator.free(to_free)
            self._add_leaf(node, new_key, new_value, key)
        elif to_free:
            self.allocator.free(to_free)
        return pos

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Protect ``node`` and its ancestors from eviction; returns the evictable-size change."""
        if self.disable:
            return 0
        if node.value is None:
            raise ValueError(
                f"{node!r} is no longer in the cache (evicted or reset); lock a node from a "
                "fresh match_prefix"
            )
        delta = 0
        while node.parent is not None:
            if node.lock_ref == 0:
                delta -= len(node.key)
            node.lock_ref += 1
            node = node.parent
        self._evictable_size += delta
        self._protected_size -= delta
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Undo one ``inc_lock_ref(node)``; returns the change in evictable size."""
        if self.disable or node.parent is None:
            return 0
        if node.value is None or node.lock_ref <= 0:
            raise ValueError(f"dec_lock_ref on {node!r}, which holds no lock in this cache")
        delta = 0
        if node.lock_ref == 1 and not node.children:
            self._push(node)  # an unlocked leaf from now on
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                delta += len(node.key)
            node = node.parent
        self._evictable_size += delta
        self._protected_size -= delta
        return delta

    def evict(self, num_tokens: int) -> int:
        """Evict least-recently-used unlocked leaves until ``num_tokens`` tokens are freed.

        Returns the number of tokens evicted (whole nodes, so possibly more than asked; fewer
        if not enough is evictable). A parent left without children becomes a candidate.
        """
        if self.disable or num_tokens <= 0:
            return 0
        heap = self._heap
        evicted = 0
        while evicted < num_tokens and heap:
            queued, _, leaf = heappop(heap)
            if leaf.value is None or leaf.lock_ref or leaf.children:
                continue  # stale: evicted, locked or no longer a leaf
            if queued != self._evict_key(leaf):
                self._push(leaf)  # used since it was queued
                continue
            evicted += len(leaf.key)
            self._delete_leaf(leaf)
        return evicted

    def evictable_size(self) -> int:
        """Tokens held in unlocked nodes."""
        return self._evictable_size

    def protected_size(self) -> int:
        """Tokens held in locked nodes."""
        return self._protected_size

    def total_size(self) -> int:
        """Tokens held by the cache."""
        return self._evictable_size + self._protected_size

    def reset(self) -> None:
        """Drop every entry, free its slots and announce ``AllBlocksCleared`` (events on)."""
        if self.root is not None:
            slots: list[int] = []
            for node in self._nodes():
                slots += node.value
                node.value = None
            for root in self.roots():
                root.value = None
            if slots:
                self.allocator.free(slots)
        self.root = self._new_root()
        self._namespace_roots = {}
        self._evictable_size = 0
        self._protected_size = 0
        self._heap = []
        self._num_nodes = 0
        if self._events is not None:
            self._events.cleared()

    def roots(self) -> list[TreeNode]:
        """The root of the default namespace first, then the namespaced trees' roots."""
        return [self.root, *self._namespace_roots.values()]

    def take_events(self) -> list:
        """The KV events recorded since the last call, oldest first ([] with events off)."""
        return self._events.take() if self._events is not None else []

    def _alloc(self, node: TreeNode, n: int) -> list[int]:
        if self.allocator.available_size() < n:
            # Keep the node the new leaf hangs from while making room.
            self.inc_lock_ref(node)
            try:
                self.evict(n - self.allocator.available_size())
            finally:
                self.dec_lock_ref(node)
        slots = self.allocator.alloc(n)
        if slots is None:
            raise OutOfKVSlotsError(
                f"insert needs {n} KV slots but only {self.allocator.available_size()} are free "
                f"after evicting ({self._protected_size} tokens are locked)"
            )
        return slots

    def _new_root(self, namespace: tuple | None = None) -> TreeNode:
        # A root's key is the empty key of its namespace.
        key = [] if namespace is None else RadixKey([], *namespace)
        events = self._events is not None
        root = TreeNode(key, [], None, [] if events else None, self._tick(), [] if events else None)
        root.lock_ref = 1
        return root

    def _namespace_root(self, namespace: tuple) -> TreeNode:
        root = self._namespace_roots.get(namespace)
        if root is None:
            root = self._namespace_roots[namespace] = self._new_root(namespace)
        return root

    def _split(self, child: TreeNode, m: int) -> TreeNode:
        """Cut ``child`` after ``m`` tokens; returns the upper part (``child`` keeps the rest)."""
        digests, hashes = child.digests, child.hashes
        cut = m // self.page_size
        upper = TreeNode(
            child.key[:m],
            child.value[:m],
            child.parent,
            None if digests is None else digests[:cut],
            child.last_access_time,
            None if hashes is None else hashes[:cut],
        )
        upper.lock_ref = child.lock_ref
        upper.created, upper.hit_count = child.created, child.hit_count
        upper.priority = child.priority
        upper.children[self._child_key(child.key, m)] = child
        child.parent.children[self._child_key(child.key, 0)] = upper
        child.key = child.key[m:]
        child.value = child.value[m:]
        if digests is not None:
            child.digests = digests[cut:]
            child.hashes = hashes[cut:]
        child.parent = upper
        child.last_access_time = self._tick()
        self._num_nodes += 1
        return upper

    def _add_leaf(
        self, parent: TreeNode, key: list[int], value: list[int], full_key: list[int]
    ) -> None:
        """Hang a new leaf holding ``key`` (the unmatched part of ``full_key``) from ``parent``."""
        events = self._events
        digests = hashes = None
        extra_key = cache_salt = None
        if type(full_key) is RadixKey:
            extra_key, cache_salt = full_key.extra_key, full_key.cache_salt
        if events is not None:
            parent_digest = parent.digests[-1] if parent.digests else None
            digests, hashes = events.hash_pages(key, parent_digest, extra_key, cache_salt)
        leaf = TreeNode(key, value, parent, digests, self._tick(), hashes)
        if type(full_key) is RadixKey and full_key.priority is not None:
            leaf.priority = full_key.priority
        if parent.parent is None and parent is not self.root:
            # Making room for this leaf may have emptied (and dropped) its namespace's root.
            self._namespace_roots[parent.key.namespace] = parent
        parent.children[self._child_key(key, 0)] = leaf
        self._evictable_size += len(key)
        self._num_nodes += 1
        self._push(leaf)
        if events is not None:
            events.stored(key, hashes, parent.hashes[-1] if parent.hashes else None, cache_salt)

    def _delete_leaf(self, leaf: TreeNode) -> None:
        if self._events is not None:
            self._events.removed(leaf.hashes)
        self.allocator.free(leaf.value)
        parent = leaf.parent
        del parent.children[self._child_key(leaf.key, 0)]
        self._evictable_size -= len(leaf.key)
        self._num_nodes -= 1
        leaf.value = None
        if not parent.children:
            if parent.lock_ref == 0:
                self._push(parent)
            elif parent.parent is None and parent is not self.root:
                # An emptied namespace's root goes too, so that many namespaces leave nothing.
                del self._namespace_roots[parent.key.namespace]

    def _push(self, node: TreeNode) -> None:
        """Queue ``node``, which just became (or still is) an unlocked leaf, for eviction."""
        heap = self._heap
        if len(heap) > 2 * self._num_nodes + 64:
            # Mostly stale entries: rebuild from the tree (amortised over the pushes since).
            heap[:] = [
                (self._evict_key(n), self._seq(), n)
                for n in self._nodes()
                if not n.children and not n.lock_ref
            ]
            heapify(heap)
        heappush(heap, (self._evict_key(node), self._seq(), node))

    def _nodes(self) -> list[TreeNode]:
        """Every node of every namespace's tree but the roots."""
        nodes, stack = [], [c for root in self.roots() for c in root.children.values()]
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes
