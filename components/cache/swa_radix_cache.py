"""The sliding-window (SWA) radix cache, after SGLang's SWARadixCache.

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

Match and insert (the tombstone rules) are here; locking is in ``swa_locks``, the two pools'
allocation and eviction in ``swa_pools``, the node and slot helpers in ``swa_tree_node``, the
tree machinery in ``radix_tree``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.cache_params import InsertParams, InsertResult, MatchPrefixParams
from schedkit.components.cache.introspection import (
    swa_available_and_evictable_str,
    swa_sanity_check,
)
from schedkit.components.cache.radix_tree import MatchResult, RadixTree, make_pool
from schedkit.components.cache.sglang_api import takes_cache_init_params
from schedkit.components.cache.swa_locks import SWALocking
from schedkit.components.cache.swa_pools import SWAPools
from schedkit.components.cache.swa_tree_node import (
    SWATreeNode,
    bigram_key,
    collect_duplicates,
    live_slots,
    live_tail_start,
    split_swa_fields,
    to_bigrams,
)
from schedkit.components.cache.tree_node import slot_list
from schedkit.core.component import ArgumentError, component

__all__ = ["SWARadixCache", "SWATreeNode", "bigram_key"]


@takes_cache_init_params
@component("swa_radix_cache")
class SWARadixCache(SWALocking, SWAPools, RadixTree):
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
        if type(key) is MatchPrefixParams:
            key = key.key
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
        needed. ``priority`` raises the eviction priority of every node on the path. Given an
        ``InsertParams``, returns an ``InsertResult``.
        """
        if type(key) is InsertParams:
            return InsertResult(prefix_len=self.insert(key.key, key.value, priority=key.priority))
        namespace = getattr(key, "namespace", None)
        key = key if type(key) is list else list(key)
        if value is not None and type(value) is not list:
            value = slot_list(value)
        if swa_value is not None and value is None:
            raise ValueError("swa_value= needs value= (one full slot per token)")
        free_full: list[int] = []
        free_swa: list[int] = []
        extra_full: list[int] = []
        extra_swa: list = []
        if self.is_eagle and not (key and type(key[0]) is tuple):
            key, value, swa_value, extra_full, extra_swa = to_bigrams(key, value, swa_value)
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
                free_swa += live_slots(swa_value[end:] + extra_swa)
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
                collect_duplicates(value[pos : pos + m], child.value, free_full)
            if swa_value is not None:
                given = swa_value[pos : pos + m]
                if child.swa_value is not None:
                    collect_duplicates(given, child.swa_value, free_swa)
                else:
                    cut = live_tail_start(given, self.page_size)
                    free_swa += live_slots(given[:cut])
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
            cut = live_tail_start(new_swa, self.page_size)
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

    # Both pools' free plus evictable slots, and the sliding-window rules checked too.
    available_and_evictable_str = swa_available_and_evictable_str
    sanity_check = swa_sanity_check

    _split_extra = staticmethod(split_swa_fields)

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
