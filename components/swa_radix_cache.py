"""The sliding-window (SWA) radix cache, after SGLang's SWARadixCache.

Models that mix full-attention and sliding-window-attention layers keep two KV pools: every
cached token has a full-attention slot (``value``, from ``allocator``) and, while it may still
fall inside some request's window, a sliding-window slot (``swa_value``, from
``swa_allocator``). Evicting only sliding-window KV turns a node into a *tombstone*: its SWA
slots are freed, its full slots and pages stay (no event). A prefix can be reused only if the
last ``sliding_window_size`` tokens before its end have sliding-window KV, so tombstones break a
match unless enough live tokens follow them.

Ownership is as in ``schedkit.components.radix_cache``: ``insert`` takes every slot it is
given, frees the ones it does not keep, and the cache gives its slots back on eviction and
reset. A ``swa_value`` entry of None means that token has no sliding-window slot (already freed
by the request); the part of a new suffix before the last run of live entries is stored as a
tombstone, and a tombstoned node whose tokens all come with live entries is revived.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence

import attrs
from schedkit.components._event_recorder import EventRecorder
from schedkit.components.allocator import OutOfKVSlotsError, TokenToKVPoolAllocator
from schedkit.components.radix_cache import (
    MatchResult,
    TreeNode,
    child_key_fn,
    make_pool,
    match_len,
)

from schedkit.component import at_least, component

__all__ = ["SWARadixCache", "SWATreeNode"]


class SWATreeNode(TreeNode):
    """A radix-tree node holding full-attention and sliding-window KV slots.

    ``lock_ref`` counts full-attention locks and ``swa_lock_ref`` sliding-window locks (a node
    with a sliding-window lock always has a full lock). ``swa_value`` is None for a tombstone.
    ``swa_uuid`` marks the node where some lock's sliding-window part stops.
    """

    __slots__ = ("swa_lock_ref", "swa_uuid", "swa_value")

    def __init__(
        self,
        key: list[int],
        value: list[int],
        swa_value: list[int] | None,
        parent: SWATreeNode | None,
        digests: list[bytes] | None,
        last_access_time: int,
        hashes: list[int] | None = None,
    ) -> None:
        super().__init__(key, value, parent, digests, last_access_time, hashes)
        self.swa_value = swa_value
        self.swa_lock_ref = 0
        self.swa_uuid: int | None = None

    @property
    def tombstone(self) -> bool:
        """True when the node's sliding-window KV has been evicted."""
        return self.swa_value is None


@component("swa_radix_cache")
class SWARadixCache:
    """Radix prefix cache for hybrid full / sliding-window attention models.

    Same interface as ``RadixCache`` with these differences: ``insert`` also takes
    ``swa_value``; ``inc_lock_ref`` returns a token that ``dec_lock_ref`` needs back;
    ``evict(num_tokens, swa_num_tokens)`` returns ``(full_evicted, swa_evicted)``. Without
    ``swa_allocator`` or ``swa_capacity`` the sliding-window pool is as large as the full one.
    """

    sliding_window_size: int = attrs.field(validator=at_least(1))
    page_size: int = attrs.field(default=1, validator=at_least(1))
    enable_kv_cache_events: bool = False
    allocator: TokenToKVPoolAllocator | None = None
    swa_allocator: TokenToKVPoolAllocator | None = None
    capacity: int | None = None
    swa_capacity: int | None = None
    disable: bool = False

    root: SWATreeNode | None = attrs.field(init=False, repr=False, default=None)
    _full_evictable: int = attrs.field(init=False, repr=False, default=0)
    _full_protected: int = attrs.field(init=False, repr=False, default=0)
    _swa_evictable: int = attrs.field(init=False, repr=False, default=0)
    _swa_protected: int = attrs.field(init=False, repr=False, default=0)
    _events: EventRecorder | None = attrs.field(init=False, repr=False, default=None)
    _tick: Callable[[], int] = attrs.field(init=False, repr=False)
    _new_uuid: Callable[[], int] = attrs.field(init=False, repr=False)
    _child_key: Callable[[list[int], int], object] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self.allocator = make_pool(self.allocator, self.capacity, self.page_size)
        if self.swa_allocator is None and self.swa_capacity is None:
            self.swa_capacity = self.allocator.size
        self.swa_allocator = make_pool(
            self.swa_allocator, self.swa_capacity, self.page_size, ("swa_allocator", "swa_capacity")
        )
        if self.enable_kv_cache_events:
            self._events = EventRecorder(self.page_size)
        self._tick = itertools.count().__next__
        self._new_uuid = itertools.count(1).__next__
        self._child_key = child_key_fn(self.page_size)
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
        key = _plain_key(key)
        end = len(key) - len(key) % self.page_size
        window = self.sliding_window_size
        path: list[SWATreeNode] = []
        since_tombstone = float("inf")
        best, best_node = 0, node
        pos = 0
        while pos < end:
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            if child.swa_value is None:
                if since_tombstone >= window:
                    best, best_node = len(path), node
                since_tombstone = 0
            m = match_len(child.key, key, pos, self.page_size)
            if m < len(child.key):
                child = self._split(child, m)
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
            indices += n.value
            swa_indices += n.swa_value if n.swa_value is not None else [None] * len(n.value)
        return MatchResult(indices, best_node, swa_indices)

    def insert(
        self,
        key: Sequence[int],
        value: Sequence[int] | None = None,
        swa_value: Sequence[int | None] | None = None,
    ) -> int:
        """Store ``key`` with its KV slots; returns how many leading tokens were already cached.

        Give both ``value`` and ``swa_value`` (one entry per token) or neither, in which case
        the cache allocates both kinds of slot for the new part, evicting if needed.
        """
        key = _plain_key(key)
        if (value is None) != (swa_value is None):
            raise ValueError("give both value= and swa_value= (one slot per token), or neither")
        free_full: list[int] = []
        free_swa: list[int] = []
        if value is not None:
            value, swa_value = list(value), list(swa_value)
            if len(value) != len(key) or len(swa_value) != len(key):
                raise ValueError(
                    f"value has {len(value)} and swa_value {len(swa_value)} slots for "
                    f"{len(key)} tokens; give one slot per token"
                )
        if self.disable:
            if value is not None:
                self._free(value, swa_value)
            return 0
        end = len(key) - len(key) % self.page_size
        if value is not None:
            free_full += value[end:]
            free_swa += _live(swa_value[end:])
        revive: list[tuple[SWATreeNode, list[int]]] = []
        node, pos = self.root, 0
        while pos < end:
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            m = match_len(child.key, key, pos, self.page_size)
            if m < len(child.key):
                child = self._split(child, m)
            child.last_access_time = self._tick()
            if value is not None:
                _collect_duplicates(value[pos : pos + m], child.value, free_full)
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
            digests = hashes = None
            if self._events is not None:
                parent_digest = node.digests[-1] if node.digests else None
                digests, hashes = self._events.hash_pages(key[pos:end], parent_digest)
            if value is None:
                slots = self._alloc(node, size)
                if slots is None:
                    return self._insert_failed(key, node, size)
                new_value, new_swa = slots
            else:
                new_value, new_swa = value[pos:end], swa_value[pos:end]
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
            page_cut = cut // self.page_size
            d = h = None
            if cut:
                if digests is not None:
                    d, h = digests[:page_cut], hashes[:page_cut]
                node = self._add_node(node, key[pos : pos + cut], new_value[:cut], None, d, h)
            if digests is not None:
                d, h = digests[page_cut:], hashes[page_cut:]
            self._add_node(node, key[pos + cut : end], new_value[cut:], new_swa[cut:], d, h)
        return pos

    def inc_lock_ref(self, node: SWATreeNode) -> int | None:
        """Protect ``node``'s path from eviction: full KV up to the root, sliding-window KV for
        the last ``sliding_window_size`` tokens. Returns the token to pass to ``dec_lock_ref``.
        """
        if self.disable or node is self.root:
            return None
        if node.value is None:
            raise ValueError(
                f"{node!r} is no longer in the cache (evicted or reset); lock a node from a "
                "fresh match_prefix"
            )
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
        self._lock_full(node, 1)
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

    def dec_lock_ref(self, node: SWATreeNode, swa_uuid_for_lock: int | None = None) -> None:
        """Undo one ``inc_lock_ref(node)``; ``swa_uuid_for_lock`` is what it returned."""
        if self.disable or node is self.root:
            return
        if node.value is None or node.lock_ref <= 0:
            raise ValueError(f"dec_lock_ref on {node!r}, which holds no lock in this cache")
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
        self._lock_full(node, -1)
        while node is not root:
            self._lock_swa(node, -1)
            if swa_uuid_for_lock is not None and node.swa_uuid == swa_uuid_for_lock:
                break
            node = node.parent

    def evict(self, num_tokens: int = 0, swa_num_tokens: int = 0) -> tuple[int, int]:
        """Free at least ``num_tokens`` full and ``swa_num_tokens`` sliding-window tokens.

        Full eviction deletes least-recently-used unlocked leaves (``BlockRemoved``) and
        then any tombstoned parents left childless. Sliding-window eviction frees the SWA KV of
        least-recently-used nodes without a sliding-window lock: an inner node becomes a
        tombstone (no event); an unlocked leaf is deleted outright (``BlockRemoved``), since a
        tombstone leaf could never be matched. Returns ``(full_evicted, swa_evicted)``.
        """
        if self.disable:
            return 0, 0
        full_evicted = swa_evicted = 0
        root = self.root
        if num_tokens > 0:
            heap = [
                (n.last_access_time, n) for n in self._nodes() if not n.children and not n.lock_ref
            ]
            heapq.heapify(heap)
            while full_evicted < num_tokens and heap:
                _, leaf = heapq.heappop(heap)
                full, swa, parent = self._delete_leaf(leaf)
                full_evicted += full
                swa_evicted += swa
                if parent is not root and not parent.children and not parent.lock_ref:
                    heapq.heappush(heap, (parent.last_access_time, parent))
        if swa_evicted < swa_num_tokens:
            heap = [
                (n.last_access_time, n)
                for n in self._nodes()
                if n.swa_value is not None and not n.swa_lock_ref
            ]
            heapq.heapify(heap)
            while swa_evicted < swa_num_tokens and heap:
                _, node = heapq.heappop(heap)
                if node.children or node.lock_ref:
                    swa_evicted += len(node.key)
                    self.swa_allocator.free(node.swa_value)
                    node.swa_value = None
                    self._swa_evictable -= len(node.key)
                else:
                    full, swa, _ = self._delete_leaf(node)
                    full_evicted += full
                    swa_evicted += swa
        return full_evicted, swa_evicted

    def full_evictable_size(self) -> int:
        """Tokens whose full KV is unlocked."""
        return self._full_evictable

    def swa_evictable_size(self) -> int:
        """Tokens whose sliding-window KV is present and unlocked."""
        return self._swa_evictable

    def full_protected_size(self) -> int:
        """Tokens whose full KV is locked."""
        return self._full_protected

    def swa_protected_size(self) -> int:
        """Tokens whose sliding-window KV is locked."""
        return self._swa_protected

    def evictable_size(self) -> int:
        """Same as ``full_evictable_size``."""
        return self._full_evictable

    def protected_size(self) -> int:
        """Same as ``full_protected_size``."""
        return self._full_protected

    def total_size(self) -> int:
        """Tokens held (with full KV, tombstones included)."""
        return self._full_evictable + self._full_protected

    def swa_total_size(self) -> int:
        """Tokens held with sliding-window KV (tombstones excluded)."""
        return self._swa_evictable + self._swa_protected

    def reset(self) -> None:
        """Drop every entry, free its slots and announce ``AllBlocksCleared`` (events on)."""
        if self.root is not None:
            full: list[int] = []
            swa: list[int] = []
            for node in self._nodes():
                full += node.value
                if node.swa_value is not None:
                    swa += node.swa_value
                node.value = node.swa_value = None
            self.root.value = None
            self._free(full, swa)
        events_on = self._events is not None
        self.root = SWATreeNode(
            [], [], [], None, [] if events_on else None, self._tick(), [] if events_on else None
        )
        self.root.lock_ref = self.root.swa_lock_ref = 1
        self._full_evictable = self._full_protected = 0
        self._swa_evictable = self._swa_protected = 0
        if self._events is not None:
            self._events.cleared()

    def take_events(self) -> list:
        """The KV events recorded since the last call, oldest first ([] with events off)."""
        return self._events.take() if self._events is not None else []

    def _nodes(self) -> Iterator[SWATreeNode]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

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

    def _lock_full(self, node: SWATreeNode, delta: int) -> None:
        moved = 0
        root = self.root
        while node is not root:
            if delta > 0 and node.lock_ref == 0:
                moved += len(node.key)
            node.lock_ref += delta
            if delta < 0 and node.lock_ref == 0:
                moved -= len(node.key)
            node = node.parent
        self._full_evictable -= moved
        self._full_protected += moved

    def _lock_swa(self, node: SWATreeNode, delta: int) -> None:
        if node.swa_lock_ref == 0:
            self._swa_evictable -= len(node.key)
            self._swa_protected += len(node.key)
        node.swa_lock_ref += delta
        if node.swa_lock_ref == 0:
            self._swa_evictable += len(node.key)
            self._swa_protected -= len(node.key)

    def _alloc(self, node: SWATreeNode, n: int) -> tuple[list[int], list[int]] | None:
        full_short = n - self.allocator.available_size()
        swa_short = n - self.swa_allocator.available_size()
        if full_short > 0 or swa_short > 0:
            # Keep the node the new leaf hangs from, and its window KV, while making room.
            pin_window = node is not self.root and node.swa_value is not None
            self._lock_full(node, 1)
            if pin_window:
                self._lock_swa(node, 1)
            try:
                self.evict(max(full_short, 0), max(swa_short, 0))
            finally:
                self._lock_full(node, -1)
                if pin_window:
                    self._lock_swa(node, -1)
        if self.allocator.available_size() < n or self.swa_allocator.available_size() < n:
            return None
        return self.allocator.alloc(n), self.swa_allocator.alloc(n)

    def _insert_failed(self, key: list[int], node: SWATreeNode, size: int) -> int:
        tombstone = node.swa_value is None and not node.children and not node.lock_ref
        if node is not self.root and tombstone:
            # Eviction emptied the tombstone the new part would hang from: drop it, start over.
            self._delete_leaf(node)
            return self.insert(key)
        raise OutOfKVSlotsError(
            f"insert needs {size} full and {size} sliding-window KV slots but only "
            f"{self.allocator.available_size()} and {self.swa_allocator.available_size()} "
            "are free after evicting"
        )

    def _split(self, child: SWATreeNode, m: int) -> SWATreeNode:
        """Cut ``child`` after ``m`` tokens; returns the upper part (``child`` keeps the rest)."""
        digests, hashes, swa = child.digests, child.hashes, child.swa_value
        cut = m // self.page_size
        upper = SWATreeNode(
            child.key[:m],
            child.value[:m],
            None if swa is None else swa[:m],
            child.parent,
            None if digests is None else digests[:cut],
            child.last_access_time,
            None if hashes is None else hashes[:cut],
        )
        upper.lock_ref = child.lock_ref
        upper.swa_lock_ref = child.swa_lock_ref
        # A lock whose window ended in ``child`` now ends in the upper part.
        upper.swa_uuid, child.swa_uuid = child.swa_uuid, None
        upper.children[self._child_key(child.key, m)] = child
        child.parent.children[self._child_key(child.key, 0)] = upper
        child.key = child.key[m:]
        child.value = child.value[m:]
        if swa is not None:
            child.swa_value = swa[m:]
        if digests is not None:
            child.digests = digests[cut:]
            child.hashes = hashes[cut:]
        child.parent = upper
        child.last_access_time = self._tick()
        return upper

    def _add_node(
        self,
        parent: SWATreeNode,
        key: list[int],
        value: list[int],
        swa_value: list[int] | None,
        digests: list[bytes] | None,
        hashes: list[int] | None,
    ) -> SWATreeNode:
        node = SWATreeNode(key, value, swa_value, parent, digests, self._tick(), hashes)
        parent.children[self._child_key(key, 0)] = node
        self._full_evictable += len(key)
        if swa_value is not None:
            self._swa_evictable += len(key)
        if self._events is not None:
            self._events.stored(key, hashes, parent.hashes[-1] if parent.hashes else None)
        return node

    def _delete_leaf(self, leaf: SWATreeNode) -> tuple[int, int, SWATreeNode]:
        """Delete ``leaf`` and the tombstoned ancestors it leaves childless and unlocked.

        Returns the full and sliding-window tokens freed and the first surviving ancestor.
        """
        full = swa = 0
        root = self.root
        while True:
            if self._events is not None:
                self._events.removed(leaf.hashes)
            size = len(leaf.key)
            self.allocator.free(leaf.value)
            full += size
            self._full_evictable -= size
            if leaf.swa_value is not None:
                self.swa_allocator.free(leaf.swa_value)
                swa += size
                self._swa_evictable -= size
            parent = leaf.parent
            del parent.children[self._child_key(leaf.key, 0)]
            leaf.value = leaf.swa_value = None
            if parent is root or parent.children or parent.swa_value is not None or parent.lock_ref:
                return full, swa, parent
            leaf = parent


def _plain_key(key: Sequence[int]) -> list[int]:
    if getattr(key, "namespace", None) is not None:
        raise ValueError(
            "swa_radix_cache has no namespaces: requests with extra_key or cache_salt need "
            "radix_cache"
        )
    return list(key)


def _live(slots: list[int | None]) -> list[int]:
    return [s for s in slots if s is not None]


def _collect_duplicates(given: list, own: list[int], out: list[int]) -> None:
    """Add to ``out`` the given slots that are not the cache's own slot at the same position."""
    if given != own:
        out += [g for g, o in zip(given, own, strict=True) if g is not None and g != o]
