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
"""

from __future__ import annotations

from collections.abc import Sequence

from schedkit.components.allocator import OutOfKVSlotsError
from schedkit.components.radix_tree import MatchResult, RadixKey, RadixTree, TreeNode

from schedkit.component import component

__all__ = ["MatchResult", "RadixCache", "RadixKey", "TreeNode"]


@component("radix_cache")
class RadixCache(RadixTree):
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
        node = self.root
        if self.disable:
            return MatchResult([], node)
        namespace = getattr(key, "namespace", None)
        if not isinstance(key, list):
            key = list(key)
        tick, child_of = self._tick, self._child
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
        """Store ``key`` with its KV slots; returns how many leading tokens were already cached.

        ``value`` holds one slot per token of ``key`` (see the module docstring for who owns
        what afterwards); without it the cache allocates slots for the new part, evicting if
        needed, and raises ``OutOfKVSlotsError`` if the pool cannot supply them. ``priority``
        (the inserting request's) raises the eviction priority of every node on the path.
        """
        namespace = getattr(key, "namespace", None)
        if not isinstance(key, list):
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
        priority = priority or 0
        tick, child_of = self._tick, self._child
        end = len(key) - len(key) % self.page_size
        # Slots the cache will not keep: the trailing partial page, and the caller's copies of
        # tokens already cached (freed apart: each is a run the allocator frees in bulk).
        tail = value[end:] if value is not None else []
        to_free: list[int] = []
        node, pos = self.root, 0
        while pos < end:
            child, m = child_of(node, key, pos, end, namespace)
            if child is None:
                break
            child.last_access_time = tick()
            if priority > child.priority:
                child.priority = priority
            if value is not None:
                given = value[pos : pos + m]
                if given != child.value:
                    to_free += [v for v, own in zip(given, child.value, strict=True) if v != own]
            node = child
            pos += m
        if pos < end:
            new_key = key[pos:end]
            raw = self._pack(new_key)
            new_value = value[pos:end] if value is not None else self._alloc(node, end - pos)
            leaf = TreeNode(new_key, new_value, node, namespace, tick())
            leaf.priority = priority
            self._attach(leaf, raw)
        for slots in (tail, to_free):
            if slots:
                self.allocator.free(slots)
        return pos

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
        if not enough is evictable). A parent left without children becomes a candidate.
        """
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
