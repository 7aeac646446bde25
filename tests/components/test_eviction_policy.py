"""Eviction order of the radix cache under each policy (SGLang's strategies)."""

import pytest
from schedkit.components.radix_cache import RadixCache, RadixKey

from schedkit.kv_events.hashing import page_hashes
from tests.components.cache_events import removed_hashes


def cache(policy):
    c = RadixCache(capacity=64, enable_kv_cache_events=True, eviction_policy=policy)
    c.take_events()
    return c


def eviction_order(c, n):
    """The first token of each leaf evicted, one leaf at a time."""
    order = []
    for _ in range(n):
        c.evict(1)
        (h,) = removed_hashes(c.take_events())[:1]
        order.append(next(t for t in range(100) if page_hashes([t], 1)[0] == h))
    return order


def test_lru_evicts_the_least_recently_used():
    c = cache("lru")
    for t in (1, 2, 3):
        c.insert([t])
    c.match_prefix([1])
    assert eviction_order(c, 3) == [2, 3, 1]


def test_lfu_evicts_the_least_hit_then_least_recent():
    c = cache("lfu")
    for t in (1, 2, 3):
        c.insert([t])
    for _ in range(3):
        c.match_prefix([1])
    c.match_prefix([2])
    c.match_prefix([3])
    c.match_prefix([3])
    assert eviction_order(c, 3) == [2, 3, 1]


def test_fifo_evicts_the_first_inserted_whatever_its_use():
    c = cache("fifo")
    for t in (1, 2, 3):
        c.insert([t])
    c.match_prefix([1])
    c.match_prefix([1])
    assert eviction_order(c, 3) == [1, 2, 3]


def test_priority_evicts_the_lowest_priority_first():
    c = cache("priority")
    c.insert(RadixKey([1], priority=5))
    c.insert(RadixKey([2], priority=-1))
    c.insert([3])  # default priority 0
    c.insert(RadixKey([2], priority=9))  # a more important request reuses 2
    assert eviction_order(c, 3) == [3, 1, 2]


def test_a_split_node_keeps_its_history():
    c = cache("fifo")
    c.insert([1, 2, 3])
    c.insert([9])
    c.insert([1, 2, 7])  # splits [1, 2, 3] into [1, 2] + [3]
    c.evict(1)  # [3] is as old as [1, 2, 3] was: first in
    assert c.match_prefix([1, 2, 3]).prefix_len == 2 and c.match_prefix([9]).prefix_len == 1
    c.evict(1)
    assert c.match_prefix([9]).prefix_len == 0 and c.match_prefix([1, 2, 7]).prefix_len == 3


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="eviction_policy"):
        RadixCache(capacity=8, eviction_policy="mru")
