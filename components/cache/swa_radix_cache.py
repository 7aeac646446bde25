"""The sliding-window (SWA) radix cache, after SGLang's SWARadixCache.

(Longer than 300 lines: the tombstone rules of insert, match, lock and eviction depend on one
another and read best together; the tree machinery itself lives in ``radix_tree``.)

Models that mix full-attention and sliding-window-attention layers keep two KV pools: every
cached token has a full-attention slot (``value``, from ``allocator``) and, while it may still
fall inside some request's window, a sliding-window slot (``swa_value``, from
``swa_allocator``). Evicting only sliding-window KV turns a node into a *tombstone*: its SWA
slots are freed, its full slots and pages stay (no event). A prefix can be reused only if the
last ``sliding_window_size`` tokens before its end have sliding-window KV, so tombstones break a
match unless enough live tokens follow them.

Ownership is as in ``schedkit.components.cache.radix_cache``: ``insert`` takes every slot it is
given, frees the ones it does not keep, and the cache gives its slots back on eviction and
reset. A ``swa_value`` entry of None means that token has no sliding-window slot (already freed
by the request); the part of a new suffix before the last run of live entries is stored as a
tombstone, and a tombstoned node whose tokens all come with live entries is revived.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from schedkit.components.cache.allocator import OutOfKVSlotsError, TokenToKVPoolAllocator
from schedkit.components.cache.introspection import (
    swa_available_and_evictable_str,
    swa_sanity_check,
)
from schedkit.components.cache.radix_tree import MatchResult, RadixTree, TreeNode, make_pool
from schedkit.core.component import ArgumentError, component

__all__ = ["SWARadixCache", "SWATreeNode", "bigram_key"]


class SWATreeNode(TreeNode):
    """A radix-tree node holding full-attention and sliding-window KV slots.

    ``lock_ref`` counts full-attention locks and ``swa_lock_ref`` sliding-window locks (a node
    with a sliding-window lock always has a full lock). ``swa_value`` is None for a tombstone.
    ``swa_uuid`` marks the node where some lock's sliding-window part stops.
    """

    __slots__ = ("swa_lock_ref", "swa_uuid", "swa_value")

    def __init__(self, key: list[int], value: list[int], parent: Any, namespace: Any, t: int):
        super().__init__(key, value, parent, namespace, t)
        self.swa_value: list[int] | None = None
        self.swa_lock_ref = 0
        self.swa_uuid: int | None = None

    @property
    def tombstone(self) -> bool:
        """True when the node's sliding-window KV has been evicted."""
        return self.swa_value is None


@component("swa_radix_cache")
class SWARadixCache(RadixTree):
    """Radix prefix cache for hybrid full / sliding-window attention models.

    Same interface as ``RadixCache`` (and the same ``eviction_policy`` choices) with these
    additions: ``insert`` also takes ``swa_value``; ``inc_lock_ref`` returns a token that
    ``dec_lock_ref`` needs back (``swa_uuid_for_lock``); ``evict(num_tokens, swa_num_tokens)``
    also frees sliding-window KV and returns ``(full_evicted, swa_evicted)``. Without
    ``swa_allocator`` or ``swa_capacity`` the sliding-window pool is as large as the full one.
    """

    sliding_window_size: int
    swa_allocator: TokenToKVPoolAllocator | None = None
    swa_capacity: int | None = None
    # SGLang's SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT: cut a new leaf longer than one page-aligned
    # window so that locking it protects one window of sliding-window KV, not the whole leaf.
    split_leaf_on_insert: bool = False
    # EAGLE speculative decoding: keys are bigrams (token i, token i + 1), one per token that
    # has a successor, as SGLang's ``is_eagle`` (the draft model's KV is one token shifted).
    is_eagle: bool = False

    _swa_evictable: int = attrs.field(init=False, repr=False, default=0)
    _swa_protected: int = attrs.field(init=False, repr=False, default=0)
    _new_uuid: Callable[[], int] = attrs.field(init=False, repr=False)

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too)."""
        window = args.sliding_window_size
        if not isinstance(window, int) or window < 1:
            raise ArgumentError(
                "sliding_window_size",
                f"sliding_window_size must be an integer >= 1, got {window!r}",
            )
        if args.is_eagle and args.enable_kv_cache_events:
            raise ArgumentError(
                "is_eagle",
                "is_eagle with enable_kv_cache_events is not supported: SGLang publishes bigram "
                "pages as token pairs, which the event structs (token_ids: list[int]) cannot carry",
            )
        capacity = args.swa_capacity
        if capacity is not None and args.swa_allocator is not None:
            raise ArgumentError(
                "swa_capacity", "pass either swa_allocator or swa_capacity, not both"
            )
        if capacity is not None:
            page_size = args.page_size
            if not isinstance(capacity, int) or capacity < 0 or capacity % page_size:
                raise ArgumentError(
                    "swa_capacity",
                    f"swa_capacity must be a non-negative multiple of page_size={page_size}, "
                    f"got {capacity!r} (e.g. {max(page_size, capacity - capacity % page_size)})",
                )

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)
        self._setup()
        if self.swa_allocator is None and self.swa_capacity is None:
            self.swa_capacity = self.allocator.size
        self.swa_allocator = make_pool(
            self.swa_allocator, self.swa_capacity, self.page_size, ("swa_allocator", "swa_capacity")
        )
        self._new_uuid = itertools.count(1).__next__
        self.reset()

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """The longest cached whole-page prefix of ``key`` that ends with a live window.

        The match stops at the last point where either no tombstone lies on the path, or at
        least ``sliding_window_size`` live tokens follow the last tombstone. Nodes on the
        matched path are marked used, parents before children (so parents go first on SWA
        eviction). ``swa_indices`` has None for tombstoned tokens.
        """
        node = self.root
        if self.disable:
            return MatchResult([], node, [])
        namespace = getattr(key, "namespace", None)
        key = key if type(key) is list else list(key)
        if self.is_eagle:
            key = bigram_key(key)
        end = len(key) - len(key) % self.page_size
        window = self.sliding_window_size
        path: list[SWATreeNode] = []
        since_tombstone = float("inf")
        best, best_node = 0, node
        pos = 0
        while pos < end:
            child, m = self._child(node, key, pos, end, namespace)
            if child is None:
                break
            if child.swa_value is None:
                if since_tombstone >= window:
                    best, best_node = len(path), node
                since_tombstone = 0
            path.append(child)
            if child.swa_value is not None:
                since_tombstone += m
            node = child
            pos += m
        if since_tombstone >= window:
            best, best_node = len(path), node
        indices: list[int] = []
        swa_indices: list[int | None] = []
        for n in path[:best]:
            n.last_access_time = self._tick()
            n.hit_count += 1
            indices += n.value
            swa_indices += n.swa_value if n.swa_value is not None else [None] * len(n.value)
        return MatchResult(indices, best_node, swa_indices)

    def insert(
        self,
        key: Sequence[int],
        value: Sequence[int] | None = None,
        swa_value: Sequence[int | None] | None = None,
        priority: int | None = None,
    ) -> int:
        """Store ``key`` with its KV slots; returns how many leading tokens were already cached.

        With ``value`` and ``swa_value`` (one entry per token) the cache takes both kinds of
        slot. With ``value`` alone (a request's full KV, as the scheduler hands it over) the
        cache gives the new part sliding-window slots of its own (evicting sliding-window KV
        if short; if still short, only for the new part's last window of pages, the rest
        becoming a tombstone). With neither it allocates both for the new part, evicting if
        needed. ``priority`` raises the eviction priority of every node on the path.
        """
        namespace = getattr(key, "namespace", None)
        key = key if type(key) is list else list(key)
        if swa_value is not None and value is None:
            raise ValueError("swa_value= needs value= (one full slot per token)")
        free_full: list[int] = []
        free_swa: list[int] = []
        extra_full: list[int] = []
        extra_swa: list = []
        if self.is_eagle and not (key and type(key[0]) is tuple):
            key, value, swa_value, extra_full, extra_swa = self._to_bigrams(key, value, swa_value)
        if value is not None:
            value = list(value)
            swa_value = None if swa_value is None else list(swa_value)
            if len(value) != len(key) or (swa_value is not None and len(swa_value) != len(key)):
                raise ValueError(
                    f"value has {len(value)} and swa_value "
                    f"{len(swa_value) if swa_value is not None else 'no'} slots for "
                    f"{len(key)} tokens; give one slot per token"
                )
        if self.disable:
            if value is not None:
                self._free(value + extra_full, (swa_value or []) + extra_swa)
            return 0
        priority = priority or 0
        end = len(key) - len(key) % self.page_size
        if value is not None:
            # One free per pool: a page can hold both an unaligned tail and the extra slots.
            free_full += value[end:] + extra_full
            if swa_value is not None:
                free_swa += _live(swa_value[end:] + extra_swa)
        revive: list[tuple[SWATreeNode, list[int]]] = []
        node, pos = self.root, 0
        while pos < end:
            child, m = self._child(node, key, pos, end, namespace)
            if child is None:
                break
            child.last_access_time = self._tick()
            if priority > child.priority:
                child.priority = priority
            if value is not None:
                _collect_duplicates(value[pos : pos + m], child.value, free_full)
            if swa_value is not None:
                given = swa_value[pos : pos + m]
                if child.swa_value is not None:
                    _collect_duplicates(given, child.swa_value, free_swa)
                else:
                    cut = self._live_tail_start(given)
                    free_swa += _live(given[:cut])
                    if cut < m:
                        if cut:
                            self._split(child, cut)  # child keeps the revivable tail
                        revive.append((child, given[cut:]))
            node = child
            pos += m

        size = end - pos
        if size:
            raw = self._pack(key[pos:end])
            if value is None:
                slots = self._alloc(node, size)
                if slots is None:
                    return self._insert_failed(key, node, size, priority)
                new_value, new_swa = slots
            else:
                new_value = value[pos:end]
                if swa_value is not None:
                    new_swa = swa_value[pos:end]
                else:
                    new_swa = self._window_slots(node, size)
        self._free(free_full, free_swa)
        for n, slots in revive:
            n.swa_value = slots
            self._swa_evictable += len(slots)
        if size:
            cut = self._live_tail_start(new_swa)
            if cut == size:
                # No live window at the end: a tombstone leaf would never match, so keep nothing.
                self._free(new_value, new_swa)
                return pos
            self._free([], new_swa[:cut])
            keep = (namespace, priority)
            head, tail = (None, None) if raw is None else self._events.cut(raw, cut)
            if cut:
                node = self._add_node(node, key[pos : pos + cut], new_value[:cut], None, head, keep)
            leaf = self._add_node(
                node, key[pos + cut : end], new_value[cut:], new_swa[cut:], tail, keep
            )
            if self.split_leaf_on_insert:
                self._split_leaf_at_window(leaf)
        return pos

    @staticmethod
    def _to_bigrams(
        tokens: list[int], value: Sequence[int] | None, swa_value: Sequence | None
    ) -> tuple[list[tuple[int, int]], list[int] | None, list | None, list[int], list]:
        """EAGLE: the bigram key of ``tokens``, the slots it keeps (one per bigram), and the
        slots of a last token without a successor, for the caller to free (SGLang's
        cache_finished_req frees them)."""
        key = bigram_key(tokens)
        n = len(key)
        if value is None:
            return key, None, None, [], []
        value = list(value)
        if len(value) not in (n, len(tokens)):
            raise ValueError(
                f"value has {len(value)} slots for {len(tokens)} tokens ({n} bigrams); give "
                "one slot per token or per bigram"
            )
        swa_value = None if swa_value is None else list(swa_value)
        extra_swa = [] if swa_value is None else swa_value[n:]
        return key, value[:n], None if swa_value is None else swa_value[:n], value[n:], extra_swa

    def _split_leaf_at_window(self, leaf: SWATreeNode) -> None:
        """Cut an unlocked live leaf longer than the page-aligned window so that its last
        node is exactly that window (SGLang's ``_maybe_split_leaf_for_swa_lock``)."""
        page = self.page_size
        tail = -(-self.sliding_window_size // page) * page
        if leaf.swa_lock_ref or leaf.swa_value is None or len(leaf.key) <= tail:
            return
        self._split(leaf, len(leaf.key) - tail)

    def inc_lock_ref(self, node: SWATreeNode) -> int | None:
        """Protect ``node``'s path from eviction: full KV up to the root, sliding-window KV for
        the last ``sliding_window_size`` tokens. Returns the token to pass to ``dec_lock_ref``.
        """
        if self.disable or node is self.root:
            return None
        self._check_lockable(node)
        window, root = self.sliding_window_size, self.root
        n, covered = node, 0
        while n is not root and covered < window:
            if n.swa_value is None:
                raise ValueError(
                    f"cannot lock {node!r}: a tombstone lies within its sliding window; lock the "
                    "last_node of a fresh match_prefix"
                )
            covered += len(n.key)
            n = n.parent
        self._lock(node)
        uuid, covered = None, 0
        while covered < window and node is not root:
            self._lock_swa(node, 1)
            covered += len(node.key)
            if covered >= window:
                if node.swa_uuid is None:
                    node.swa_uuid = self._new_uuid()
                uuid = node.swa_uuid
            node = node.parent
        return uuid

    def dec_lock_ref(
        self, node: SWATreeNode, swa_uuid_for_lock: int | None = None, skip_swa: bool = False
    ) -> None:
        """Undo one ``inc_lock_ref(node)``; ``swa_uuid_for_lock`` is what it returned.
        ``skip_swa``: its sliding-window part was released already (``dec_swa_lock_only``)."""
        if self.disable or node is self.root:
            return
        self._check_unlockable(node)
        if skip_swa:
            self._unlock(node)
            return
        root, n = self.root, node
        while n is not root:
            if n.swa_value is None or n.swa_lock_ref <= 0:
                raise ValueError(
                    f"dec_lock_ref({node!r}, swa_uuid_for_lock={swa_uuid_for_lock}) does not "
                    "match a lock; pass the value inc_lock_ref returned"
                )
            if swa_uuid_for_lock is not None and n.swa_uuid == swa_uuid_for_lock:
                break
            n = n.parent
        else:
            if swa_uuid_for_lock is not None:
                raise ValueError(f"swa_uuid_for_lock={swa_uuid_for_lock} is not on {node!r}'s path")
        self._unlock(node)
        while node is not root:
            self._lock_swa(node, -1)
            if swa_uuid_for_lock is not None and node.swa_uuid == swa_uuid_for_lock:
                break
            node = node.parent

    def dec_swa_lock_only(self, node: SWATreeNode, swa_uuid_for_lock: int | None = None) -> None:
        """Release only the sliding-window part of one ``inc_lock_ref(node)`` (SGLang's early
        release once a request decodes past its window); the full lock stays, to be released
        with ``dec_lock_ref(node, swa_uuid_for_lock, skip_swa=True)``. A node left without a
        window lock becomes evictable; a leaf frees its sliding-window KV at once and becomes
        a tombstone (its full KV stays while locked)."""
        if self.disable or node is self.root:
            return
        root, n = self.root, node
        while n is not root:
            if n.swa_value is None or n.swa_lock_ref <= 0:
                raise ValueError(
                    f"dec_swa_lock_only({node!r}, swa_uuid_for_lock={swa_uuid_for_lock}) does "
                    "not match a window lock; pass the value inc_lock_ref returned, once"
                )
            if swa_uuid_for_lock is not None and n.swa_uuid == swa_uuid_for_lock:
                break
            n = n.parent
        while node is not root:
            self._lock_swa(node, -1)
            if node.swa_lock_ref == 0 and not node.children:
                self.swa_allocator.free(node.swa_value)
                self._swa_evictable -= len(node.key)
                node.swa_value = None
            if swa_uuid_for_lock is not None and node.swa_uuid == swa_uuid_for_lock:
                break
            node = node.parent

    def available_and_evictable_str(self) -> str:
        """Both pools' free plus evictable slots, worded as SGLang's."""
        return swa_available_and_evictable_str(self)

    def sanity_check(self) -> None:
        """``RadixTree.sanity_check`` plus the sliding-window rules and sizes."""
        swa_sanity_check(self)

    def evict(self, num_tokens: int = 0, swa_num_tokens: int = 0) -> tuple[int, int]:
        """Free at least ``num_tokens`` full and ``swa_num_tokens`` sliding-window tokens.

        Full eviction deletes unlocked leaves in eviction-policy order (``BlockRemoved``) and
        then any tombstoned parents left childless. Sliding-window eviction frees the SWA KV of
        nodes without a sliding-window lock, in the same order: an inner node becomes a
        tombstone (no event); an unlocked leaf is deleted outright (``BlockRemoved``), since a
        tombstone leaf could never be matched. Returns ``(full_evicted, swa_evicted)``.
        """
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

    def _live_tail_start(self, swa: list[int | None]) -> int:
        """Where the trailing run of live SWA slots starts, rounded up to a page boundary."""
        i = len(swa)
        while i and swa[i - 1] is not None:
            i -= 1
        return -(-i // self.page_size) * self.page_size

    def _free(self, full: list[int], swa: list[int | None]) -> None:
        if full:
            self.allocator.free(full)
        live = _live(swa)
        if live:
            self.swa_allocator.free(live)

    def _lock_swa(self, node: SWATreeNode, delta: int) -> None:
        if node.swa_lock_ref == 0:
            self._swa_evictable -= len(node.key)
            self._swa_protected += len(node.key)
        node.swa_lock_ref += delta
        if node.swa_lock_ref == 0:
            self._swa_evictable += len(node.key)
            self._swa_protected -= len(node.key)

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

    def _split_extra(self, upper: SWATreeNode, lower: SWATreeNode, m: int) -> None:
        swa = lower.swa_value
        upper.swa_value = None if swa is None else swa[:m]
        if swa is not None:
            lower.swa_value = swa[m:]
        upper.swa_lock_ref = lower.swa_lock_ref
        # A lock whose window ended in ``lower`` now ends in the upper part.
        upper.swa_uuid, lower.swa_uuid = lower.swa_uuid, None

    def _add_node(
        self,
        parent: SWATreeNode,
        key: list[int],
        value: list[int],
        swa_value: list[int] | None,
        raw: bytes | None,
        namespace_and_priority: tuple,
    ) -> SWATreeNode:
        namespace, priority = namespace_and_priority
        node = SWATreeNode(key, value, parent, namespace, self._tick())
        node.swa_value = swa_value
        node.priority = priority
        if swa_value is not None:
            self._swa_evictable += len(key)
        return self._attach(node, raw)

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


def bigram_key(tokens: list) -> list[tuple[int, int]]:
    """EAGLE's bigram key: ``[1, 2, 3]`` -> ``[(1, 2), (2, 3)]`` (a key of bigrams stays)."""
    if tokens and type(tokens[0]) is tuple:
        return tokens
    return list(itertools.pairwise(tokens))


def _live(slots: list[int | None]) -> list[int]:
    return [s for s in slots if s is not None]


def _collect_duplicates(given: list, own: list[int], out: list[int]) -> None:
    """Add to ``out`` the given slots that are not the cache's own slot at the same position."""
    if given != own:
        out += [g for g, o in zip(given, own, strict=True) if g is not None and g != o]
