"""Radix-cache introspection as SGLang's tests use it: RadixKey indexing and repr, node ids and
ordering, pretty_print, all_values_flatten, available_and_evictable_str, sanity_check."""

import io

import pytest

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.cache.swa_radix_cache import SWARadixCache
from schedkit.components.cache.tree_node import RadixKey


def radix(size=64, page_size=1):
    return RadixCache(allocator=TokenToKVPoolAllocator(size=size, page_size=page_size))


def test_radix_key_indexing_and_slicing_keep_the_namespace():
    key = RadixKey([1, 2, 3, 4], "lora-a", "salt")
    part = key[1:3]
    assert type(part) is RadixKey and part == [2, 3]
    assert (part.extra_key, part.cache_salt) == ("lora-a", "salt")
    one = key[0]
    assert type(one) is RadixKey and one == [1] and one.extra_key == "lora-a"
    assert key[-1] == [4]
    assert key.token_ids == [1, 2, 3, 4] and type(key.token_ids) is list


def test_radix_key_repr_is_sglangs():
    assert repr(RadixKey([1, 2, 3], "k")) == "RadixKey(extra_key='k', token_ids=[1, 2, 3])"
    long = RadixKey(list(range(12)))
    assert repr(long) == "RadixKey(extra_key=None, token_ids=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]...)"


def test_a_radix_key_is_matched_and_inserted_by_its_tokens_in_its_namespace():
    cache = radix()
    key = RadixKey([1, 2, 3, 4], "k")
    cache.insert(key)
    assert cache.match_prefix(key[:3]).prefix_len == 3
    assert cache.match_prefix([1, 2, 3]).prefix_len == 0
    assert all(type(n.key) is list for n in cache._nodes())


def test_node_ids_count_up_and_nodes_order_by_last_access():
    cache = radix()
    cache.insert([1, 2])
    cache.insert([3, 4])
    first = cache.match_prefix([1, 2]).last_node
    second = cache.match_prefix([3, 4]).last_node
    assert second.id > first.id
    assert first < second  # [1, 2] was used before [3, 4]
    cache.match_prefix([1, 2])
    assert second < first
    assert sorted([first, second]) == [second, first]


def test_pretty_print_shows_every_node_indented_with_its_lock():
    cache = radix()
    cache.insert(list(range(1, 13)))
    cache.insert([1, 2, 99])
    node = cache.match_prefix([1, 2, 99]).last_node
    cache.inc_lock_ref(node)
    out = io.StringIO()
    cache.pretty_print(file=out)
    assert out.getvalue().splitlines() == [
        " 0 [] r=1",
        "   2 [1, 2] r=1",
        "     1 [99] r=1",
        "     10 [3, 4, 5, 6, 7, 8, 9, 10, 11, 12] r=0",
        "#tokens: 13",
    ]


def test_all_values_flatten_is_every_slot_depth_first():
    cache = radix()
    a, b, c = cache.allocator.alloc(3), cache.allocator.alloc(3), cache.allocator.alloc(1)
    cache.insert([1, 2, 3], a)
    cache.insert([1, 2, 7], b)  # its first two slots duplicate a's: freed by the cache
    cache.insert([5], c)
    assert cache.all_values_flatten() == [*a, b[2], *c]
    cache.evict(100)
    assert cache.all_values_flatten() == []


def test_available_and_evictable_str_is_sglangs_wording():
    cache = radix(size=16)
    cache.insert([1, 2, 3, 4])
    node = cache.match_prefix([1, 2]).last_node
    cache.inc_lock_ref(node)
    assert cache.available_and_evictable_str() == (
        "Available tokens: 14 (available_size=12 + evictable_size=2)\n"
    )


def test_sanity_check_passes_a_consistent_tree_and_names_a_broken_counter():
    cache = radix()
    cache.insert([1, 2, 3])
    cache.inc_lock_ref(cache.match_prefix([1, 2, 3]).last_node)
    cache.sanity_check()
    cache._evictable_size += 1
    with pytest.raises(AssertionError, match="evictable size 1 but unlocked nodes hold 0"):
        cache.sanity_check()


def swa(**kwargs):
    return SWARadixCache(sliding_window_size=4, capacity=64, **kwargs)


def test_swa_available_and_evictable_str_is_sglangs_wording():
    cache = swa(swa_capacity=32)
    cache.insert(list(range(1, 9)))
    assert cache.available_and_evictable_str() == (
        "Available full tokens: 64 (full_available_size=56 + full_evictable_size=8)\n"
        "Available swa tokens: 32 (swa_available_size=24 + swa_evictable_size=8)\n"
        "Full LRU list evictable size: 8\n"
        "SWA LRU list evictable size: 8\n"
    )


def test_swa_sanity_check_finds_a_window_lock_without_a_full_lock():
    cache = swa()
    cache.insert(list(range(1, 9)))
    node = cache.match_prefix(list(range(1, 9))).last_node
    token = cache.inc_lock_ref(node)
    cache.sanity_check()
    cache.dec_lock_ref(node, token)
    cache.sanity_check()
    node.swa_lock_ref = 1
    with pytest.raises(AssertionError, match="window lock without a full lock"):
        cache.sanity_check()
