import pytest

from components.allocator import TokenToKVPoolAllocator
from components.radix_cache import RadixCache
from components.schedule_policy import FCFSPolicy, LPMPolicy
from schedkit.component import component_name
from schedkit.schedule_batch import Req


def cache_with(*keys):
    allocator = TokenToKVPoolAllocator(size=256)
    cache = RadixCache(allocator=allocator)
    for key in keys:
        cache.insert(key, allocator.alloc(len(key)))
    return cache


def queue():
    # Cached: [1..8] and [50, 51]. Prefix matches: a 0, b 2, c 8, d 4, e 2.
    return [
        Req(rid="a", origin_input_ids=[9, 9, 9]),
        Req(rid="b", origin_input_ids=[50, 51, 52, 53]),
        Req(rid="c", origin_input_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9]),
        Req(rid="d", origin_input_ids=[1, 2, 3, 4, 0]),
        Req(rid="e", origin_input_ids=[50, 51, 60], output_ids=[61]),
    ]


def test_registered_names():
    assert component_name(FCFSPolicy) == "fcfs"
    assert component_name(LPMPolicy) == "lpm"


def test_fcfs_keeps_arrival_order():
    q = queue()
    FCFSPolicy().calc_priority(q)
    assert [r.rid for r in q] == ["a", "b", "c", "d", "e"]


def test_lpm_sorts_by_longest_cached_prefix_stably():
    cache = cache_with([1, 2, 3, 4, 5, 6, 7, 8], [50, 51])
    q = queue()
    LPMPolicy(tree_cache=cache).calc_priority(q)
    assert [r.rid for r in q] == ["c", "d", "b", "e", "a"]
    assert [r.prefix_len for r in q] == [8, 4, 2, 2, 0]


def test_lpm_never_counts_the_last_token_as_cached():
    cache = cache_with([1, 2, 3])
    q = [Req(rid="x", origin_input_ids=[1, 2, 3])]
    LPMPolicy(tree_cache=cache).calc_priority(q)
    assert q[0].prefix_len == 2


def test_lpm_falls_back_to_fcfs_above_the_threshold():
    cache = cache_with([1, 2, 3, 4, 5, 6, 7, 8])
    q = queue()
    LPMPolicy(tree_cache=cache, max_queue_for_prefix_match=4).calc_priority(q)
    assert [r.rid for r in q] == ["a", "b", "c", "d", "e"]
    assert all(r.prefix_len == 0 for r in q)
    LPMPolicy(tree_cache=cache, max_queue_for_prefix_match=5).calc_priority(q)
    assert q[0].rid == "c"


def test_lpm_default_threshold_is_sglangs():
    assert LPMPolicy(tree_cache=cache_with()).max_queue_for_prefix_match == 128
    with pytest.raises(ValueError, match="max_queue_for_prefix_match"):
        LPMPolicy(tree_cache=cache_with(), max_queue_for_prefix_match=-1)
