"""PrefillAdder, KVSlots and NewTokenRatio alone."""

import pytest
from schedkit.components.allocator import TokenToKVPoolAllocator
from schedkit.components.kv_slots import KVSlots
from schedkit.components.new_token_ratio import NewTokenRatio
from schedkit.components.prefill_adder import PrefillAdder
from schedkit.components.radix_cache import RadixCache
from schedkit.components.schedule_batch import Req, SamplingParams


def kv_slots(size=64, page_size=1):
    allocator = TokenToKVPoolAllocator(size=size, page_size=page_size)
    return KVSlots(allocator, RadixCache(allocator=allocator, page_size=page_size), page_size)


def req(rid, n, max_new_tokens=8):
    return Req(
        rid=rid,
        origin_input_ids=list(range(100, 100 + n)),
        sampling_params=SamplingParams(max_new_tokens=max_new_tokens),
    )


def adder(kv, running=(), ratio=0.0, max_prefill=1000, chunk=None, max_running=8):
    return PrefillAdder(kv, list(running), ratio, max_prefill, chunk, max_running)


def test_admits_within_the_kv_room_and_reserves_for_admitted_outputs():
    kv = kv_slots(64)
    a = adder(kv)
    assert a.add_one_req(req("a", 20, max_new_tokens=20))  # 20 + 20 reserved of 64
    assert not a.add_one_req(req("b", 20, max_new_tokens=10))  # 20 + 10 > 64 - 40
    assert [r.rid for r in a.batch.reqs] == ["a"] and a.batch.extend_lens == [20]


def test_the_chunk_budget_cuts_a_request_into_a_chunked_one():
    kv = kv_slots(64, page_size=4)
    a = adder(kv, chunk=10)
    long = req("long", 30)
    assert a.add_one_req(long)
    assert a.batch.extend_lens == [8]  # whole pages of the 10-token chunk
    assert a.new_chunked_req is long and long.is_chunked and not a.budget_left()
    nxt = adder(kv, chunk=10)
    assert nxt.add_chunked_req(long)
    assert nxt.batch.prefix_lens == [8] and nxt.batch.cache_hit_lens == [0]


def test_a_cached_prefix_is_matched_locked_and_counted_as_a_hit():
    kv = kv_slots(64)
    kv.tree_cache.insert(list(range(100, 116)))
    a = adder(kv)
    r = req("r", 20)
    assert a.add_one_req(r)
    assert a.batch.prefix_lens == [16] and a.batch.cache_hit_lens == [16]
    assert r.cached_tokens == 16 and kv.tree_cache.protected_size() == 16
    kv.release(r)
    assert kv.tree_cache.protected_size() == 0 and r.kv_indices == []


def test_running_requests_reserve_room_by_the_ratio():
    kv = kv_slots(64)
    running = [req("run", 1, max_new_tokens=40)]
    assert not adder(kv, running, ratio=1.0).add_one_req(req("x", 20, max_new_tokens=10))
    assert adder(kv, running, ratio=0.25).add_one_req(req("x", 20, max_new_tokens=10))


def test_new_token_ratio_decays_resets_and_follows_retractions():
    ratio = NewTokenRatio(0.5, 0.1, 4)
    ratio.decay()
    assert ratio.value == pytest.approx(0.4)
    for _ in range(10):
        ratio.decay()
    assert ratio.value == 0.1
    ratio.after_retract(decoded=10, running=2, max_new_tokens=100)
    assert ratio.value == pytest.approx(0.5)
    ratio.reset()
    assert ratio.value == 0.5
    with pytest.raises(ValueError, match="min_new_token_ratio"):
        NewTokenRatio(0.1, 0.5, 4)
