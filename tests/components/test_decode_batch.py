"""take_decode_slots and retract_decode alone, on a real allocator and radix cache."""

import pytest
from schedkit.components.allocator import TokenToKVPoolAllocator
from schedkit.components.decode_batch import retract_decode, take_decode_slots
from schedkit.components.kv_slots import KVSlots
from schedkit.components.radix_cache import RadixCache
from schedkit.components.schedule_batch import FinishLength, Req, SamplingParams


def kv_slots(size, page_size=1):
    allocator = TokenToKVPoolAllocator(size=size, page_size=page_size)
    cache = RadixCache(allocator=allocator, page_size=page_size)
    return KVSlots(allocator, cache, page_size)


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
