"""The radix prefix cache: token prefixes and their KV slots in a radix tree, after SGLang's
RadixCache, with KV-cache events for KV-aware routers.

KV slots are plain ints handed out by a ``TokenToKVPoolAllocator``. Ownership rules:

- ``insert(key, value)`` takes ownership of every slot in ``value``. Slots for tokens the cache
  already holds are freed, except those that already are the cache's own slot at that position
  (a prefix obtained from ``match_prefix``); the slots of a trailing partial page (page_size > 1)
  are freed too. The slots of the newly stored part belong to the cache from then on.
- ``insert(key)`` without a value takes slots for the new part from the cache's allocator,
  evicting unlocked entries (in eviction-policy order) if the pool is short.
- ``evict`` and ``reset`` give the cache's slots back to the allocator.

A key that is a ``RadixKey`` with an ``extra_key`` or ``cache_salt`` lives in its own
namespace: it shares nodes only with keys of the same namespace, and its published page hashes
are namespaced (``schedkit.kv_events.hashing``).

Match, insert, locks and eviction are here; ``cache_finished_req`` and ``cache_unfinished_req``,
which insert from a request's locked prefix node, in ``radix_req_caching``.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedkit.components.cache.allocator import OutOfKVSlotsError
from schedkit.components.cache.cache_params import (
    CacheInitParams,
    EvictParams,
    EvictResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
)
from schedkit.components.cache.radix_req_caching import RadixReqCaching
from schedkit.components.cache.radix_tree import MatchResult, RadixKey, RadixTree, TreeNode
from schedkit.components.cache.sglang_api import takes_cache_init_params
from schedkit.components.cache.tree_node import Tokens, slot_list, tokens_of
from schedkit.core.component import component

__all__ = [
    "CacheInitParams",
    "EvictParams",
    "EvictResult",
    "InsertParams",
    "InsertResult",
    "MatchPrefixParams",
    "MatchResult",
    "RadixCache",
    "RadixKey",
    "TreeNode",
]


@takes_cache_init_params
@component("radix_cache")
class RadixCache(RadixReqCaching, RadixTree):
    """Prefix cache over a radix tree; evicts unlocked leaves by ``eviction_policy``
    (``lru``, ``lfu``, ``fifo`` or ``priority``).

    With ``page_size > 1`` keys are matched and stored in whole pages and nodes split only at
    page boundaries. With ``enable_kv_cache_events`` every new node's pages are announced
    (``BlockStored``), every evicted node withdrawn (``BlockRemoved``) and ``reset`` (run by
    the constructor too) announces ``AllBlocksCleared``. With ``disable`` nothing is cached:
    matches are empty and inserted slots are freed.
    """

    def __attrs_post_init__(self) -> None:
        self._setup()
        self.reset()

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """The longest cached whole-page prefix of ``key``; marks its nodes as just used.

        A match ending inside a node splits that node so that ``last_node`` ends exactly at
        the match (splitting emits no event).
        """
        if type(key) is MatchPrefixParams:
            key = key.key
        node = self.root
        if self.disable:
            return MatchResult([], node)
        namespace = getattr(key, "namespace", None)
        key = tokens_of(key)  # a RadixKey or another sequence: its plain tokens
        child_of, tick = self._child, self._tick
        end = len(key) - len(key) % self.page_size
        pos = 0
        indices: list[int] = []
        while pos < end:
            child, m = child_of(node, key, pos, end, namespace)
            if child is None:
                break
            child.last_access_time = tick()
            child.hit_count += 1
            indices += child.value
            node = child
            pos += m
        return MatchResult(indices, node)

    def insert(
        self, key: Sequence[int], value: Sequence[int] | None = None, priority: int | None = None
    ) -> int:
        """Store ``key`` with its KV slots; returns how many leading tokens were already cached
        (given an ``InsertParams``: an ``InsertResult`` with that ``prefix_len``).

        ``value`` holds one slot per token of ``key`` (a list of ints, or anything with
        ``tolist()``; see the module docstring for who owns what afterwards); without it the
        cache allocates slots for the new part, evicting if needed, and raises
        ``OutOfKVSlotsError`` if the pool cannot supply them. ``priority`` (the inserting
        request's) raises the eviction priority of every node on the path.
        """
        if type(key) is InsertParams:
            return InsertResult(prefix_len=self.insert(key.key, key.value, key.priority))
        namespace = getattr(key, "namespace", None)
        key = tokens_of(key)  # a RadixKey or another sequence: its plain tokens
        if value is not None:
            if type(value) is not list:
                value = slot_list(value)
            if len(value) != len(key):
                raise ValueError(
                    f"value has {len(value)} slots for {len(key)} tokens; give one slot per token"
                )
        if self.disable:
            if value:
                self.allocator.free(value)
            return 0
        end = len(key) - len(key) % self.page_size
        _, cached, duplicates = self._insert_below(
            self.root, key, end, value, priority or 0, namespace
        )
        self._free(value[end:] if value is not None else [], duplicates)
        return cached

    def _insert_below(
        self,
        node: TreeNode,
        key: Tokens,
        end: int,
        value: list[int] | None,
        priority: int,
        namespace: object,
        owned: bool = False,
    ) -> tuple[TreeNode, int, list[int]]:
        """Store ``key[:end]`` (whole pages) below ``node``; ``value`` holds their slots, or
        None to allocate them. Returns the node that ends the key, how many leading tokens
        were cached already, and the given slots of tokens the cache already had with other
        slots (for the caller to free). ``owned``: the lists are the caller's fresh copies,
        which a new node may keep instead of copying them again."""
        tick, child_of = self._tick, self._child
        to_free: list[int] = []
        pos = 0
        while pos < end:
            child, m = child_of(node, key, pos, end, namespace)
            if child is None:
                break
            child.last_access_time = tick()
            if priority > child.priority:
                child.priority = priority
            duplicates = self._through(node, child, None if value is None else value[pos : pos + m])
            if duplicates:
                to_free += duplicates
            node = child
            pos += m
        cached = pos
        if pos < end:
            whole = owned and pos == 0 and end == len(key)
            new_key = key if whole else key[pos:end]
            raw = self._pack(new_key)
            if value is None:
                new_value = self._alloc(node, end - pos)
            else:
                new_value = value if whole else value[pos:end]
            leaf = TreeNode(new_key, new_value, node, namespace, tick())
            leaf.priority = priority
            node = self._attach(leaf, raw)
            self._stored(leaf)
        return node, cached, to_free

    def _through(self, parent: TreeNode, child: TreeNode, given: list[int] | None) -> list[int]:
        """An insert passes through ``child`` (below ``parent``) with ``given`` slots for its
        tokens (None: the cache allocates): the given slots the node already holds as others,
        for the caller to free."""
        if given is None or given == child.value:
            return []
        return [v for v, own in zip(given, child.value, strict=True) if v != own]

    def _stored(self, leaf: TreeNode) -> None:
        """An insert attached ``leaf``; nothing more to do for a device-only cache."""

    def _free(self, tail: list[int], duplicates: list[int]) -> None:
        """Free what an insert does not keep: a trailing partial page, then duplicates."""
        for slots in (tail, duplicates):
            if slots:
                self.allocator.free(slots)

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Protect ``node`` and its ancestors from eviction; returns the evictable-size change
        (pass it back to ``dec_lock_ref`` or not: the radix cache does not need it)."""
        if self.disable:
            return 0
        self._check_lockable(node)
        return self._lock(node)

    def dec_lock_ref(self, node: TreeNode, swa_uuid_for_lock: object = None) -> int:
        """Undo one ``inc_lock_ref(node)``; returns the change in evictable size.
        ``swa_uuid_for_lock`` is accepted for the sliding-window cache's protocol and unused."""
        if self.disable or node is self.root:
            return 0
        self._check_unlockable(node)
        return self._unlock(node)

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves in eviction-policy order until ``num_tokens`` tokens are freed.

        Returns the number of tokens evicted (whole nodes, so possibly more than asked; fewer
        if not enough is evictable); given an ``EvictParams``, an ``EvictResult``. A parent left
        without children becomes a candidate.
        """
        if type(num_tokens) is EvictParams:
            return EvictResult(num_tokens_evicted=self.evict(num_tokens.num_tokens))
        if self.disable or num_tokens <= 0:
            return 0
        evicted = 0
        for leaf in self._evictable_leaves():
            evicted += len(leaf.key)
            self._detach(leaf)
            if evicted >= num_tokens:
                break
        return evicted

    def reset(self) -> None:
        """Drop every entry, free its slots and announce ``AllBlocksCleared`` (events on)."""
        slots: list[int] = []
        for node in self._clear(TreeNode([], [], None, None, self._tick())):
            slots += node.value
            node.value = None
        if slots:
            self.allocator.free(slots)

    def _alloc(self, node: TreeNode, n: int) -> list[int]:
        if self.allocator.available_size() < n:
            # Keep the node the new leaf hangs from while making room.
            self._lock(node)
            try:
                self.evict(n - self.allocator.available_size())
            finally:
                self._unlock(node)
        slots = self.allocator.alloc(n)
        if slots is None:
            raise OutOfKVSlotsError(
                f"insert needs {n} KV slots but only {self.allocator.available_size()} are free "
                f"after evicting ({self._protected_size} tokens are locked)"
            )
        return slots
