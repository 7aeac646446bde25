"""What fits in the next batch (``batching``), alone on a real allocator and radix cache:
KVSlots, NewTokenRatio, PrefillAdder (admission), take_decode_slots and retract_decode (a
decode step)."""

import pytest

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.scheduler.decode_slots import retract_decode, take_decode_slots
from schedkit.components.scheduler.kv_slots import KVSlots
from schedkit.components.scheduler.new_token_ratio import NewTokenRatio
from schedkit.components.scheduler.prefill_adder import PrefillAdder
from schedkit.core.schedule_batch import FinishLength, Req, SamplingParams


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


def test_admission_in_order_stops_at_the_first_that_does_not_fit():
    kv = kv_slots(64)
    a = adder(kv)
    waiting = [req("a", 20, max_new_tokens=20), req("b", 20, max_new_tokens=10), req("c", 2, 2)]
    assert a.add_in_order(waiting) == 1  # "c" would fit, but SGLang stops at "b"
    assert [r.rid for r in a.batch.reqs] == ["a"]
    full = adder(kv_slots(64), max_running=2)
    assert full.add_in_order([req(f"r{i}", 4, 4) for i in range(4)]) == 2  # the seats left


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
    # SGLang's estimate: (decoded + 20 steps per kept request) / (sum of max_new_tokens + 1).
    ratio.after_retract(decoded=10, running=2, max_new_tokens=100)
    assert ratio.value == pytest.approx(50 / 101)
    ratio.after_retract(decoded=0, running=0, max_new_tokens=0)  # nothing kept
    assert ratio.value == 0.0
    ratio.after_retract(decoded=500, running=1, max_new_tokens=100)
    assert ratio.value == 1.0
    ratio.reset()
    assert ratio.value == 0.5
    with pytest.raises(ValueError, match=r"min_new_token_ratio must be in \[0, 1\], got 1.5"):
        NewTokenRatio(0.1, 1.5, 4)


def test_a_minimum_above_the_initial_ratio_is_reached_at_the_first_decay():
    ratio = NewTokenRatio(0.1, 0.5, 4)  # SGLang accepts it: the decay step is negative
    assert ratio.value == 0.1
    ratio.decay()
    assert ratio.value == 0.5


@pytest.mark.parametrize(
    ("conservativeness", "init", "minimum"),
    [(1.0, 0.7, 0.098), (0.5, 0.35, 0.049), (2.0, 1.0, 0.14), (0.3, 0.21, 0.0294)],
)
def test_schedule_conservativeness_scales_the_ratio_as_sglang(conservativeness, init, minimum):
    # SGLang: init = min(0.7 * c, 1); minimum = min(init * 0.14, 1).
    ratio = NewTokenRatio.conservative(0.7, 0.098, 600, conservativeness)
    assert (ratio.init, ratio.minimum) == (pytest.approx(init), pytest.approx(minimum))
    with pytest.raises(ValueError, match="schedule_conservativeness must be >= 0"):
        NewTokenRatio.conservative(0.7, 0.098, 600, -1.0)


def running(kv, rid, n_kv, outputs=0, max_new_tokens=64):
    req = Req(
        rid=rid,
        origin_input_ids=list(range(10, 10 + n_kv)),
        output_ids=[1] * outputs,
        sampling_params=SamplingParams(max_new_tokens=max_new_tokens),
    )
    assert kv.extend(req, n_kv)
    return req


@pytest.mark.parametrize("page_size", [1, 4])
def test_each_request_gets_one_more_slot(page_size):
    kv = kv_slots(64, page_size)
    reqs = [running(kv, "a", 4), running(kv, "b", 5)]
    assert take_decode_slots(kv, reqs)
    assert [len(r.kv_indices) for r in reqs] == [r.num_computed_tokens for r in reqs] == [5, 6]
    b = reqs[1].kv_indices
    if page_size > 1:
        assert b[-1] == b[-2] + 1  # the next slot of b's last page, no new page


def test_a_short_pool_takes_nothing():
    kv = kv_slots(8, 4)
    reqs = [running(kv, "a", 4), running(kv, "b", 4)]  # both pages full, pool empty
    before = [list(r.kv_indices) for r in reqs]
    assert not take_decode_slots(kv, reqs)
    assert [r.kv_indices for r in reqs] == before


def test_a_short_pool_gives_back_the_slots_of_partly_filled_pages():
    kv = kv_slots(8, 4)
    reqs = [running(kv, "a", 3), running(kv, "b", 4)]  # a has room in its page, b needs one
    before = [list(r.kv_indices) for r in reqs]
    assert not take_decode_slots(kv, reqs)
    assert [r.kv_indices for r in reqs] == before


def test_retract_takes_the_fewest_outputs_first_and_never_a_finished_request():
    kv = kv_slots(32)
    a = running(kv, "a", 8, outputs=5)
    b = running(kv, "b", 8, outputs=1)
    c = running(kv, "c", 8, outputs=3)
    done = running(kv, "done", 7, outputs=0)
    done.finished_reason = FinishLength(0)
    freed = []

    def retract(req):
        freed.append(req.rid)
        kv.release(req)

    keep, retracted, need = retract_decode(kv, [a, b, c, done], retract)
    assert [r.rid for r in retracted] == freed and freed[0] == "b"
    assert "done" not in freed and keep[0] is a
    assert need == len(keep)
