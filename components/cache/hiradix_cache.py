"""The radix prefix cache with a host-memory tier, after SGLang's HiCache (``HiRadixCache``).

Every node may hold its pages' KV on the device (``value``), in a bounded host pool
(``host_value``), or both. Device eviction keeps a node whose KV has a host copy in the tree
(``value`` None, host copy kept); a match walks through such host-only nodes and reports them
as a host hit (``MatchResult.host_hit_length`` / ``last_host_node``); ``init_load_back``, run by
admission, copies them back into device slots. When the host pool is full, host-only leaves are
dropped, least recently used first (``evict_host``).

Copies to the host follow ``hicache_write_policy``: ``write_through`` backs a node up when it
enters the cache, ``write_back`` when the device evicts it. Device-to-host copies overlap the
forward pass (SGLang runs them on a separate stream) and cost no simulated time; the
host-to-device copies of a load-back are charged in full: ``take_transfer_seconds`` reports the
time of the pages loaded since its last call at ``host_bandwidth``, and the model runner adds it
to the next prefill step.

With KV events on, a host copy is announced as ``BlockStored`` with medium ``CPU_PINNED``
(SGLang's ``StorageMedium.CPU``) and withdrawn as ``BlockRemoved`` on the same medium; a device
eviction that keeps the host copy withdraws the pages from ``GPU`` only, and a load-back
announces them on ``GPU`` again.

Matching, load-back and revival are here; the host tier (copies, host eviction and its heap) is
in ``hiradix_host``, device eviction and its heap in ``hiradix_eviction``, the node in
``hi_tree_node``, the checks in ``introspection``.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.cache_params import MatchPrefixParams
from schedkit.components.cache.hi_tree_node import (
    H100_PCIE5_HOST_BANDWIDTH,
    LLAMA3_8B_KV_BYTES_PER_TOKEN,
    check_positive,
    check_write_policy,
)
from schedkit.components.cache.hiradix_eviction import DeviceEviction
from schedkit.components.cache.hiradix_host import HostTier
from schedkit.components.cache.introspection import device_values_flatten, hicache_sanity_check
from schedkit.components.cache.radix_cache import MatchResult, RadixCache
from schedkit.components.cache.sglang_api import takes_cache_init_params
from schedkit.components.cache.tree_node import TreeNode, tokens_of
from schedkit.core.component import ArgumentError, at_least, component
from schedkit.kv_events.structs import MEDIUM_GPU

__all__ = ["HiRadixCache"]


@takes_cache_init_params
@component("hiradix_cache")
class HiRadixCache(HostTier, DeviceEviction, RadixCache):
    """``RadixCache`` with SGLang's host-memory tier.

    The host pool holds ``hicache_size`` tokens, or (``hicache_size`` 0) ``hicache_ratio``
    times the device pool; it must be at least as large as the device pool, as SGLang
    requires. Host-only pages shorter than ``load_back_threshold`` tokens are not loaded back
    (SGLang's threshold, 10). ``kv_bytes_per_token`` and ``host_bandwidth`` (bytes/s) price a
    load-back.
    """

    hicache_ratio: float = attrs.field(default=2.0, validator=check_positive)
    hicache_size: int = attrs.field(default=0, validator=at_least(0))
    hicache_write_policy: Literal["write_through", "write_back"] = attrs.field(
        default="write_through", validator=check_write_policy
    )
    load_back_threshold: int = attrs.field(default=10, validator=at_least(0))
    kv_bytes_per_token: int = attrs.field(
        default=LLAMA3_8B_KV_BYTES_PER_TOKEN, validator=at_least(1)
    )
    host_bandwidth: float = attrs.field(default=H100_PCIE5_HOST_BANDWIDTH, validator=check_positive)

    host_allocator: TokenToKVPoolAllocator = attrs.field(init=False, repr=False, default=None)
    # Tokens copied device -> host and host -> device since construction.
    backed_up_tokens: int = attrs.field(init=False, repr=False, default=0)
    loaded_back_tokens: int = attrs.field(init=False, repr=False, default=0)
    _pending_load_tokens: int = attrs.field(init=False, repr=False, default=0)
    # Host-only leaves, lazily maintained as the device heap: (last access, seq, node).
    _host_heap: list = attrs.field(init=False, repr=False, factory=list)

    @classmethod
    def host_pool_size(cls, args: Any) -> int:
        """Tokens of the host pool: ``hicache_size``, or the device pool times the ratio, in
        whole pages."""
        host = args.hicache_size or int(args.allocator.size * args.hicache_ratio)
        return host - host % args.page_size

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too)."""
        device, host = args.allocator.size, cls.host_pool_size(args)
        if host < device:
            raise ArgumentError(
                "hicache_size" if args.hicache_size else "hicache_ratio",
                f"the host pool ({host} tokens from hicache_size={args.hicache_size}, "
                f"hicache_ratio={args.hicache_ratio}) must be at least the device pool "
                f"({device} tokens)",
            )

    def __attrs_post_init__(self) -> None:
        self._setup()
        self.check_arguments(self)
        host = self.host_pool_size(self)
        self.host_allocator = TokenToKVPoolAllocator(size=host, page_size=self.page_size)
        self.reset()

    def match_prefix(self, key) -> MatchResult:
        """The longest cached whole-page prefix of ``key``: ``device_indices`` and
        ``last_node`` cover its device-resident part, ``host_hit_length`` and
        ``last_host_node`` the host-only pages after it."""
        if type(key) is MatchPrefixParams:
            key = key.key
        node = self.root
        if self.disable:
            return MatchResult([], node)
        namespace = getattr(key, "namespace", None)
        key = tokens_of(key)
        child_of, tick = self._child, self._tick
        end = len(key) - len(key) % self.page_size
        pos = host = 0
        indices: list[int] = []
        last_device = node
        while pos < end:
            child, m = child_of(node, key, pos, end, namespace)
            if child is None:
                break
            child.last_access_time = tick()
            child.hit_count += 1
            if child.value is None:
                host += m
            else:
                indices += child.value
                last_device = child
            node = child
            pos += m
        return MatchResult(indices, last_device, last_host_node=node, host_hit_length=host)

    def init_load_back(
        self, last_host_node: TreeNode, host_hit_length: int = 0, mem_quota: int | None = None
    ) -> tuple[list[int], TreeNode]:
        """Copy the host-only nodes ending at ``last_host_node`` back into device slots, all or
        nothing; returns the new device slots and the node that now ends the device prefix.
        Nothing is loaded below ``load_back_threshold`` tokens, above ``mem_quota`` or when the
        device pool cannot supply the slots even after evicting."""
        node, nodes = last_host_node, []
        while node.value is None:
            if node.host_value is None:
                raise ValueError(f"{node!r} is no longer in the cache; match again")
            nodes.append(node)
            node = node.parent
        if not nodes:
            return [], node
        nodes.reverse()
        n = sum(len(x.host_value) for x in nodes)
        if n < self.load_back_threshold or (mem_quota is not None and n > mem_quota):
            return [], node
        for x in nodes:
            x.protect_host()
        self._lock(node)
        try:
            short = n - self.allocator.available_size()
            if short > 0:
                self.evict(short)
            slots = self.allocator.alloc(n)
        finally:
            self._unlock(node)
            for x in nodes:
                x.release_host()
        if slots is None:
            return [], node
        offset = 0
        for x in nodes:
            k = len(x.host_value)
            x.value = slots[offset : offset + k]
            offset += k
            if self._events is not None:
                self._events.announce(x, MEDIUM_GPU)
        self._evictable_size += n
        self._pending_load_tokens += n
        self.loaded_back_tokens += n
        self._push(nodes[-1])
        return slots, nodes[-1]

    def take_transfer_seconds(self) -> float:
        """Seconds the load-backs since the last call take at ``host_bandwidth``; resets."""
        tokens, self._pending_load_tokens = self._pending_load_tokens, 0
        return tokens * self.kv_bytes_per_token / self.host_bandwidth

    def reset(self) -> None:
        """Drop every entry from both pools and announce ``AllBlocksCleared`` (events on)."""
        slots: list[int] = []
        host: list[int] = []
        for node in self._clear(TreeNode([], [], None, None, self._tick())):
            if node.value:
                slots += node.value
            if node.host_value:
                host += node.host_value
            node.value = node.host_value = None
        self._host_heap = []
        self._pending_load_tokens = 0
        if slots:
            self.allocator.free(slots)
        if host:
            self.host_allocator.free(host)

    def sanity_check(self) -> None:
        """Check the tree against the cache's counters (``introspection.hicache_sanity_check``)."""
        hicache_sanity_check(self)

    def all_values_flatten(self) -> list[int]:
        """Every device KV slot the cache holds, depth-first (host-only nodes hold none)."""
        return device_values_flatten(self)

    def _through(self, parent: TreeNode, child: TreeNode, given: list[int] | None) -> list[int]:
        """As ``RadixCache._through``; a host-only node takes the given slots (or new ones)
        and is back on the device, and with write-through a device node without a host copy
        gets one."""
        if child.value is None:
            self._revive(parent, child, given)
            duplicates = []
        else:
            duplicates = super()._through(parent, child, given)
        if self.hicache_write_policy == "write_through" and child.host_value is None:
            self.write_backup(child)
        return duplicates

    def _stored(self, leaf: TreeNode) -> None:
        """With write-through, a new node gets its host copy at once."""
        if self.hicache_write_policy == "write_through":
            self.write_backup(leaf)

    def _revive(self, parent: TreeNode, child: TreeNode, given: list[int] | None) -> None:
        """Put host-only ``child`` back on the device with the ``given`` slots (None: new)."""
        if given is None:
            child.protect_host()
            try:
                given = self._alloc(parent, len(child.key))
            finally:
                child.release_host()
        child.value = given
        self._evictable_size += len(given)
        if self._events is not None:
            self._events.announce(child, MEDIUM_GPU)
        self._push(child)

    def _split_extra(self, upper: TreeNode, lower: TreeNode, m: int) -> None:
        if lower.host_value is not None:
            upper.host_value, lower.host_value = lower.host_value[:m], lower.host_value[m:]
        upper.host_ref_counter = lower.host_ref_counter
