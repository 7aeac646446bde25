"""dfs-weight, hrrn and shortest-prefill-first, against SGLang's schedule_policy behaviour."""

import pytest

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.scheduler.cache_aware_policies import (
    DFSWeightPolicy,
    HRRNPolicy,
    ShortestPrefillFirstPolicy,
)
from schedkit.core.component import component_name
from schedkit.core.schedule_batch import Req


def cache_with(*keys, disable=False):
    allocator = TokenToKVPoolAllocator(size=256)
    cache = RadixCache(allocator=allocator, disable=disable)
    for key in keys:
        cache.insert(key, allocator.alloc(len(key)))
    return cache


def rids(q):
    return [r.rid for r in q]


def test_names_are_sglangs():
    assert component_name(DFSWeightPolicy) == "dfs-weight"
    assert component_name(HRRNPolicy) == "hrrn"
    assert component_name(ShortestPrefillFirstPolicy) == "shortest-prefill-first"


def test_dfs_weight_visits_the_heaviest_subtree_first_and_uncached_requests_last():
    # Tree: root -> [1, 2] -> {[3, 4], [5, 6]}; root -> [7, 8].
    cache = cache_with([1, 2, 3, 4], [1, 2, 5, 6], [7, 8])
    q = [
        Req(rid="none", origin_input_ids=[9, 9, 9]),
        Req(rid="x78", origin_input_ids=[7, 8, 0]),
        Req(rid="y56", origin_input_ids=[1, 2, 5, 6, 0]),
        Req(rid="z12", origin_input_ids=[1, 2, 0]),
        Req(rid="w34", origin_input_ids=[1, 2, 3, 4, 0]),
        Req(rid="v56", origin_input_ids=[1, 2, 5, 6, 1]),
    ]
    DFSWeightPolicy(tree_cache=cache).calc_priority(q)
    # [1, 2] weighs 4 (z12 + w34 + y56 + v56), [7, 8] 1: [1, 2]'s subtree first, [5, 6]
    # (weight 2) before [3, 4] (1), a node's own request after its children's, root's last.
    assert rids(q) == ["y56", "v56", "w34", "z12", "x78", "none"]
    assert [r.prefix_len for r in q] == [4, 4, 4, 2, 2, 0]


def test_dfs_weight_over_a_disabled_cache_is_fcfs():
    q = [Req(rid="b", origin_input_ids=[2]), Req(rid="a", origin_input_ids=[1])]
    DFSWeightPolicy(tree_cache=cache_with(disable=True)).calc_priority(q)
    assert rids(q) == ["b", "a"]


def test_hrrn_ages_by_processed_tokens_over_uncached_work():
    cache = cache_with([1, 2, 3, 4, 5, 6, 7, 8])
    q = [
        # waited 100 processed tokens for 10 uncached: ratio 10
        Req(rid="long", origin_input_ids=list(range(100, 110)), arrival_processed_tokens=0),
        # waited 50 for 2: ratio 25
        Req(rid="short", origin_input_ids=[200, 201], arrival_processed_tokens=50),
        # 8 of 9 cached, waited nothing: ratio 0
        Req(
            rid="fresh", origin_input_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9], arrival_processed_tokens=100
        ),
        # 7 of 8 cached (the last token is always computed), waited nothing: ratio 0
        Req(rid="cached", origin_input_ids=[1, 2, 3, 4, 5, 6, 7, 8], arrival_processed_tokens=100),
        # retracted: its prompt is all cached (uncached counts the prompt only): first of all
        Req(rid="zdone", origin_input_ids=[1, 2, 3, 4], output_ids=[5, 6, 7, 8, 9]),
    ]
    HRRNPolicy(tree_cache=cache, processed_tokens=lambda: 100).calc_priority(q)
    assert rids(q) == ["zdone", "short", "long", "cached", "fresh"]  # equal ratios by rid
    assert [r.prefix_len for r in q] == [8, 0, 0, 7, 8]


def test_hrrn_without_a_counter_is_rid_order_and_holds_back_shared_uncached_prefixes():
    cache = cache_with()
    shared = list(range(1000, 1040))
    q = [
        Req(rid="c", origin_input_ids=[*shared, 1]),
        Req(rid="b", origin_input_ids=[*shared, 2]),  # shares 40 uncached tokens with c
        Req(rid="a", origin_input_ids=[5, 6]),
    ]
    HRRNPolicy(tree_cache=cache).calc_priority(q)
    assert rids(q) == ["a", "c", "b"]


def test_shortest_prefill_first_orders_by_uncached_work_then_entry_time():
    cache = cache_with([1, 2, 3, 4, 5, 6, 7, 8])
    q = [
        Req(rid="big", origin_input_ids=list(range(100, 120)), wait_queue_entry_time=0.0),
        Req(rid="hit", origin_input_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], wait_queue_entry_time=3.0),
        Req(rid="two-late", origin_input_ids=[300, 301], wait_queue_entry_time=2.0),
        Req(rid="two-early", origin_input_ids=[400, 401], wait_queue_entry_time=1.0),
    ]
    ShortestPrefillFirstPolicy(tree_cache=cache).calc_priority(q)
    # Work: big 20, hit 10 - 8 = 2, the two-token prompts 2 each: 2s by entry time.
    assert rids(q) == ["two-early", "two-late", "hit", "big"]


def test_shortest_prefill_first_needs_prefix_caching():
    with pytest.raises(ValueError, match="requires prefix caching"):
        ShortestPrefillFirstPolicy(tree_cache=cache_with(disable=True))
