"""HiRadixCache alone: host copies, device and host eviction, load-back, events per medium."""

from __future__ import annotations

import msgspec
import pytest

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.hiradix_cache import HiRadixCache
from schedkit.core.component import component_name
from schedkit.kv_events import KvIndex, page_hashes
from schedkit.kv_events.structs import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from tests.schedkit.kv_events import engine_structs

A = list(range(100, 116))  # 16 tokens
B = list(range(200, 216))
C = list(range(300, 316))


def make_cache(device=16, page_size=4, **kwargs) -> HiRadixCache:
    allocator = TokenToKVPoolAllocator(size=device, page_size=page_size)
    kwargs.setdefault("enable_kv_cache_events", True)
    cache = HiRadixCache(allocator=allocator, page_size=page_size, **kwargs)
    cache.take_events()
    return cache


def insert_fresh(cache: HiRadixCache, tokens: list[int]) -> list[int]:
    slots = cache.allocator.alloc(len(tokens))
    assert slots is not None
    cache.insert(tokens, slots)
    return slots


def slots_accounted(cache: HiRadixCache) -> None:
    """Every device and host slot is either free or held by exactly one node."""
    device, host, stack = [], [], list(cache.root.children.values())
    while stack:
        node = stack.pop()
        device += node.value or []
        host += node.host_value or []
        stack.extend(node.children.values())
    assert len(set(device)) == len(device)
    assert len(device) + cache.allocator.available_size() == cache.allocator.size
    assert len(set(host)) == len(host)
    assert len(host) + cache.host_allocator.available_size() == cache.host_allocator.size
    assert cache.total_size() == len(device)
    assert sorted(cache.all_values_flatten()) == sorted(device)


def test_registered_and_sized_like_sglang():
    assert component_name(HiRadixCache) == "hiradix_cache"
    assert make_cache(device=16).host_allocator.size == 32  # hicache_ratio 2 by default
    assert make_cache(device=16, hicache_size=24).host_allocator.size == 24
    with pytest.raises(ValueError, match="must be at least the device pool"):
        make_cache(device=16, hicache_ratio=0.5)
    with pytest.raises(ValueError, match="unknown hicache_write_policy 'lazy'"):
        make_cache(hicache_write_policy="lazy")
    with pytest.raises(ValueError, match="host_bandwidth must be > 0"):
        make_cache(host_bandwidth=0)


def test_write_through_backs_up_on_insert_and_announces_the_cpu_copy():
    cache = make_cache()
    insert_fresh(cache, A)
    node = cache.match_prefix(A).last_node
    assert node.backuped and len(node.host_value) == 16
    assert cache.host_used_size() == 16
    gpu, cpu = cache.take_events()
    hashes = page_hashes(A, 4)
    assert gpu == BlockStored(hashes, None, A, 4, None, "GPU")
    assert cpu == BlockStored(hashes, None, A, 4, None, "CPU_PINNED")


def test_device_eviction_keeps_the_host_copy_and_match_reports_a_host_hit():
    cache = make_cache()
    insert_fresh(cache, A)
    cache.take_events()
    assert cache.evict(16) == 16
    assert cache.take_events() == [BlockRemoved(page_hashes(A, 4), "GPU")]
    assert cache.allocator.available_size() == 16 and cache.host_used_size() == 16
    match = cache.match_prefix([*A, 1, 2, 3, 4])
    assert match.device_indices == [] and match.last_node is cache.root
    assert match.host_hit_length == 16 and match.last_host_node.host_value is not None
    slots_accounted(cache)


def test_load_back_restores_device_slots_and_charges_the_transfer():
    cache = make_cache(kv_bytes_per_token=1000, host_bandwidth=1e6, load_back_threshold=8)
    insert_fresh(cache, A)
    cache.evict(16)
    cache.take_events()
    match = cache.match_prefix(A[:8])  # splits the host-only node at 8 tokens
    assert match.host_hit_length == 8
    slots, node = cache.init_load_back(match.last_host_node, match.host_hit_length)
    assert len(slots) == 8 and node is match.last_host_node
    assert cache.take_events() == [BlockStored(page_hashes(A, 4)[:2], None, A[:8], 4, None, "GPU")]
    assert cache.take_transfer_seconds() == pytest.approx(8 * 1000 / 1e6)
    assert cache.take_transfer_seconds() == 0.0
    again = cache.match_prefix(A)
    assert again.device_indices == slots and again.host_hit_length == 8
    assert cache.loaded_back_tokens == 8
    slots_accounted(cache)


def test_load_back_below_the_threshold_loads_nothing():
    cache = make_cache(load_back_threshold=10)
    insert_fresh(cache, A)
    cache.evict(16)
    match = cache.match_prefix(A[:8])
    assert cache.init_load_back(match.last_host_node) == ([], cache.root)
    assert cache.take_transfer_seconds() == 0.0


def test_host_pool_full_evicts_the_least_recently_used_host_only_leaf():
    cache = make_cache(device=16, hicache_size=32)
    insert_fresh(cache, A)
    cache.evict(16)
    insert_fresh(cache, B)
    cache.evict(16)
    cache.match_prefix(A)  # A is now more recent than B
    cache.take_events()
    insert_fresh(cache, C)  # its write-through needs 16 host slots: B goes
    events = cache.take_events()
    assert BlockRemoved(page_hashes(B, 4), "CPU_PINNED") in events
    assert cache.match_prefix(B).host_hit_length == 0
    assert cache.match_prefix(A).host_hit_length == 16
    slots_accounted(cache)


def test_protect_host_keeps_a_copy_from_host_eviction():
    cache = make_cache(device=16, hicache_size=32)
    insert_fresh(cache, A)
    cache.evict(16)
    insert_fresh(cache, B)
    cache.evict(16)
    a_node = cache.match_prefix(A).last_host_node
    b_node = cache.match_prefix(B).last_host_node
    b_node.protect_host()
    a_node.protect_host()
    insert_fresh(cache, C)  # no host room and nothing to drop: C has no host copy
    assert not cache.match_prefix(C).last_node.backuped
    a_node.release_host()
    b_node.release_host()
    with pytest.raises(RuntimeError, match="not protected"):
        a_node.release_host()
    slots_accounted(cache)


def test_write_back_copies_to_host_only_on_eviction():
    cache = make_cache(hicache_write_policy="write_back")
    insert_fresh(cache, A)
    assert cache.host_used_size() == 0
    assert [e.medium for e in cache.take_events()] == ["GPU"]
    cache.evict(16)
    assert [type(e).__name__ + ":" + e.medium for e in cache.take_events()] == [
        "BlockStored:CPU_PINNED",
        "BlockRemoved:GPU",
    ]
    assert cache.match_prefix(A).host_hit_length == 16
    slots_accounted(cache)


def test_insert_over_a_host_only_prefix_puts_it_back_on_the_device():
    cache = make_cache()
    insert_fresh(cache, A)
    cache.evict(16)
    slots = cache.allocator.alloc(16)
    assert cache.insert(A, slots) == 16
    match = cache.match_prefix(A)
    assert match.device_indices == slots and match.host_hit_length == 0
    slots_accounted(cache)


def test_eviction_without_a_host_copy_drops_the_node():
    cache = make_cache(device=16, hicache_size=16)
    insert_fresh(cache, A)
    cache.evict(16)
    a_node = cache.match_prefix(A).last_host_node
    a_node.protect_host()
    insert_fresh(cache, B)  # host full of a protected copy: B is not backed up
    cache.take_events()
    cache.evict(16)
    assert cache.take_events() == [BlockRemoved(page_hashes(B, 4), "GPU")]
    assert cache.match_prefix(B).host_hit_length == 0
    a_node.release_host()
    slots_accounted(cache)


def test_reset_frees_both_pools():
    cache = make_cache()
    insert_fresh(cache, A)
    cache.evict(16)
    insert_fresh(cache, B)
    cache.reset()
    assert cache.take_events()[-1] == AllBlocksCleared()
    assert cache.allocator.available_size() == 16 and cache.host_used_size() == 0


def test_events_decode_with_sglang_structs_and_feed_one_index_per_medium():
    cache = make_cache(device=32)
    insert_fresh(cache, A)
    insert_fresh(cache, B[:8])
    cache.match_prefix(A)  # B is the least recently used
    cache.evict(8)  # B's pages leave the device, keep their host copy
    wire = encode_batch(KVEventBatch(ts=1.0, events=cache.take_events(), attn_dp_rank=0))
    theirs = msgspec.msgpack.decode(wire, type=engine_structs.KVEventBatch)
    media = {(type(e).__name__, e.medium) for e in theirs.events}
    assert media == {("BlockStored", "GPU"), ("BlockStored", "CPU_PINNED"), ("BlockRemoved", "GPU")}
    gpu, cpu = KvIndex(medium="GPU"), KvIndex(medium="CPU_PINNED")
    for index in (gpu, cpu):
        index.apply(decode_batch(wire))
    assert gpu.match(A, 4) == {0: 4} and gpu.match(B[:8], 4) == {0: 0}
    assert cpu.match(A, 4) == {0: 4} and cpu.match(B[:8], 4) == {0: 2}
    assert cpu.owners(page_hashes(B, 4)[0]) == {0: "CPU_PINNED"}


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_random_operations_keep_every_slot_accounted(policy):
    import random

    rng = random.Random(7)
    cache = make_cache(
        device=64, hicache_ratio=1.5, hicache_write_policy=policy, load_back_threshold=4
    )
    prefixes = [[rng.randrange(50) for _ in range(8)] for _ in range(4)]
    for _ in range(400):
        tokens = rng.choice(prefixes) + [rng.randrange(5) for _ in range(rng.choice([4, 8, 12]))]
        op = rng.random()
        if op < 0.5:
            match = cache.match_prefix(tokens)
            slots, node = list(match.device_indices), match.last_node
            if match.host_hit_length:
                loaded, node = cache.init_load_back(match.last_host_node)
                slots += loaded
            need = len(tokens) - len(slots)
            cache.inc_lock_ref(node)  # the matched prefix stays while making room
            if cache.allocator.available_size() < need:
                cache.evict(need - cache.allocator.available_size())
            new = cache.allocator.alloc(need)
            cache.dec_lock_ref(node)
            if new is not None:
                cache.insert(tokens, slots + new)
        elif op < 0.8:
            cache.evict(rng.choice([4, 8, 16]))
        else:
            cache.evict_host(rng.choice([4, 8]))
        slots_accounted(cache)
        cache.sanity_check()
    gpu, cpu = KvIndex(medium="GPU"), KvIndex(medium="CPU_PINNED")
    wire = encode_batch(KVEventBatch(ts=0.0, events=cache.take_events()))
    for index in (gpu, cpu):
        index.apply(decode_batch(wire))
    device_pages = host_pages = 0
    stack = list(cache.root.children.values())
    while stack:
        node = stack.pop()
        device_pages += len(node.value or []) // 4
        host_pages += len(node.host_value or []) // 4
        stack.extend(node.children.values())
    assert gpu.num_blocks(0) == device_pages and cpu.num_blocks(0) == host_pages
    assert cache.loaded_back_tokens > 0 and cache.backed_up_tokens > 0


def test_sanity_check_names_a_device_node_below_a_host_only_one():
    cache = make_cache(device=32)
    insert_fresh(cache, A)
    cache.evict(16)
    slots = insert_fresh(cache, A + B)  # A back on the device, B below it
    upper = cache.match_prefix(A).last_node
    cache.sanity_check()
    upper.value = None  # as if A had left the device while B stayed
    with pytest.raises(AssertionError, match="on the device below a host-only node"):
        cache.sanity_check()
    upper.value = slots[:16]
