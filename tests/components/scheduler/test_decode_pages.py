"""DecodePages against the slot-by-slot decode loop it replaces: same slots, same pages."""

import random

import pytest

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.scheduler.decode_slots import take_decode_slots
from schedkit.components.scheduler.kv_slots import KVSlots
from schedkit.core.schedule_batch import Req

PAGE = 4


def reference_take(allocator, kvs, page_size):
    """The per-request loop: the next slot of the last page, or a new page (batch order)."""
    needs = [kv for kv in kvs if not len(kv) % page_size]
    if len(needs) * page_size > allocator.available_size():
        return False
    for kv in kvs:
        if len(kv) % page_size:
            kv.append(kv[-1] + 1)
    pages = allocator.alloc(len(needs) * page_size)[::page_size] if needs else []
    for kv, slot in zip(needs, pages, strict=True):
        kv.append(slot)
    return True


def make_kv(size):
    allocator = TokenToKVPoolAllocator(size=size, page_size=PAGE)
    cache = RadixCache(allocator=allocator, page_size=PAGE)
    return KVSlots(allocator, cache, PAGE), allocator


@pytest.mark.parametrize("seed", range(4))
def test_slots_match_the_per_request_loop_through_joins_leaves_reads_and_a_full_pool(seed):
    rng = random.Random(seed)
    kv, allocator = make_kv(size=PAGE * 60)
    ref_alloc = TokenToKVPoolAllocator(size=PAGE * 60, page_size=PAGE)
    reqs, refs = [], {}
    for i in range(12):
        length = rng.randint(1, 9)
        slots = allocator.alloc(-(-length // PAGE) * PAGE)[:length]
        assert ref_alloc.alloc(-(-length // PAGE) * PAGE)[:length] == slots
        reqs.append(Req(rid=f"r{i}", origin_input_ids=[1] * length, kv_indices=list(slots)))
        refs[reqs[-1].rid] = list(slots)
    running = reqs[:8]
    full = runs = 0
    for _ in range(80):
        if rng.random() < 0.15 and len(running) > 1:  # one leaves (retracted: KV freed)
            gone = running.pop(rng.randrange(len(running)))
            allocator.free(gone.kv_indices)
            ref_alloc.free(refs[gone.rid])
            gone.kv_indices, refs[gone.rid] = [], []
        if rng.random() < 0.15:  # one joins, or comes back with fresh slots
            req = rng.choice([r for r in reqs if r not in running])
            if not req.kv_indices:
                slots = allocator.alloc(PAGE)
                if slots is None:
                    continue
                assert ref_alloc.alloc(PAGE) == slots
                req.kv_indices, refs[req.rid] = slots[:2], slots[:2]
            running.insert(rng.randrange(len(running) + 1), req)
        if rng.random() < 0.2:  # someone reads a list mid-run
            probe = rng.choice(running)
            assert probe.kv_indices == refs[probe.rid]
        if rng.random() < 0.3:  # a decode run asks first: a changed batch is regrouped there
            limit = rng.randint(1, 3 * PAGE)
            expected = reference_steps_in_pool(ref_alloc, running, refs, limit)
            assert kv.decode_pages.steps_in_pool(running, limit) == expected
        ours = take_decode_slots(kv, list(running) if rng.random() < 0.3 else running)
        theirs = reference_take(ref_alloc, [refs[r.rid] for r in running], PAGE)
        assert ours == theirs
        full += not ours
        if not ours:  # the pool is full: free the last request, as a retraction would
            gone = running.pop()
            allocator.free(gone.kv_indices)
            ref_alloc.free(refs[gone.rid])
            gone.kv_indices, refs[gone.rid] = [], []
        if ours and rng.random() < 0.4:  # a run of steps of the same batch at once
            limit = rng.randint(1, 3 * PAGE)
            steps = kv.decode_pages.steps_in_pool(running, limit)
            assert steps == reference_steps_in_pool(ref_alloc, running, refs, limit)
            runs += steps > PAGE
            taken = kv.decode_pages.take_run(running, steps)
            expected = []
            for step in range(steps):
                before = ref_alloc.available_size()
                assert reference_take(ref_alloc, [refs[r.rid] for r in running], PAGE)
                if ref_alloc.available_size() != before:
                    expected.append((step, before - ref_alloc.available_size()))
            assert taken == expected
        assert allocator.available_size() == ref_alloc.available_size()
    assert {r.rid: r.kv_indices for r in reqs} == refs
    assert full > 0, "the scenario must run the pool out at least once"
    assert runs > 0, "the scenario must take runs of more than a page of steps"


def reference_steps_in_pool(allocator, running, refs, limit):
    """The steps of ``running`` whose new pages the pool still has, counted slot by slot."""
    free, lengths = allocator.available_size(), [len(refs[r.rid]) for r in running]
    for step in range(limit):
        free -= PAGE * sum(not length % PAGE for length in lengths)
        if free < 0:
            return step
        lengths = [length + 1 for length in lengths]
    return limit


def test_a_list_replaced_mid_run_stops_its_bulk_slots():
    kv, allocator = make_kv(size=PAGE * 8)
    req = Req(rid="a", origin_input_ids=[1, 2], kv_indices=allocator.alloc(PAGE)[:2])
    batch = [req]
    assert take_decode_slots(kv, batch) and take_decode_slots(kv, batch)
    assert req.kv_indices == [0, 1, 2, 3]
    req.kv_indices = [9]  # replaced (as the cache does): nothing pending is added to it
    assert req.kv_run is None and req.kv_indices == [9]
    assert take_decode_slots(kv, batch)  # same list object: regrouped, the new list is used
    assert req.kv_indices == [9, 10]
