from schedkit.components.allocator import TokenToKVPoolAllocator
from schedkit.components.radix_cache import RadixCache
from schedkit.components.req_to_cache import (
    cache_finished_req,
    cache_unfinished_req,
    fill_ids_prefix,
)
from schedkit.components.schedule_batch import Req


def make(size=32, page_size=1, disable=False):
    allocator = TokenToKVPoolAllocator(size=size, page_size=page_size)
    cache = RadixCache(allocator=allocator, page_size=page_size, disable=disable)
    return allocator, cache


def running_req(allocator, rid, prompt, output=()):
    """A request holding fresh KV for every token but the last one (as after a decode step)."""
    req = Req(rid=rid, origin_input_ids=list(prompt), output_ids=list(output))
    n = req.seqlen - 1
    page = allocator.page_size
    slots = allocator.alloc(-(-n // page) * page)
    req.kv_indices = slots[:n]
    return req


def test_finished_req_goes_into_the_cache_and_frees_duplicates():
    allocator, cache = make()
    first = running_req(allocator, "a", [1, 2, 3, 4, 5], [6])
    cache_finished_req(cache, first)
    assert first.kv_indices == [] and first.last_node is None and first.prefix_len == 0
    assert cache.total_size() == 5
    assert cache.match_prefix([1, 2, 3, 4, 5]).prefix_len == 5
    # A second request computed the same 3 leading tokens again: its copies are freed.
    second = running_req(allocator, "b", [1, 2, 3, 9], [8])
    free_before = allocator.available_size()
    cache_finished_req(cache, second)
    assert cache.total_size() == 6  # 5 + the new token 9 (the last token 8 has no KV)
    assert allocator.available_size() == free_before + 3
    assert allocator.available_size() + cache.total_size() == 32


def test_unfinished_req_takes_cache_slots_and_moves_its_lock():
    allocator, cache = make()
    first = running_req(allocator, "a", [1, 2, 3, 4], [5])
    cache_finished_req(cache, first)
    cached_slots = cache.match_prefix([1, 2, 3, 4]).device_indices

    req = running_req(allocator, "b", [1, 2, 3, 7, 8], [9])
    own_tail = req.kv_indices[3:]
    cache_unfinished_req(cache, req)
    assert req.kv_indices == cached_slots[:3] + own_tail
    assert req.prefix_len == 5
    assert req.last_node is cache.match_prefix([1, 2, 3, 7, 8]).last_node
    assert cache.protected_size() == 5 and cache.evictable_size() == 1  # token 4
    # Publishing again after more tokens moves the lock to the deeper node.
    more = allocator.alloc(1)
    req.output_ids.append(10)
    req.kv_indices = [*req.kv_indices, *more]
    cache_unfinished_req(cache, req)
    assert req.prefix_len == 6
    assert cache.protected_size() == 6
    cache_finished_req(cache, req)
    assert cache.protected_size() == 0
    assert allocator.available_size() + cache.total_size() == 32


def test_unfinished_req_keeps_its_partial_page():
    allocator, cache = make(size=32, page_size=4)
    req = running_req(allocator, "a", list(range(1, 11)), [11])  # 10 tokens with KV
    tail = req.kv_indices[8:]
    cache_unfinished_req(cache, req)
    assert req.prefix_len == 8
    assert req.kv_indices[8:] == tail
    assert len(req.kv_indices) == 10
    assert cache.total_size() == 8
    cache_finished_req(cache, req)
    # The partial page went back to the pool.
    assert allocator.available_size() == 32 - 8
    assert cache.protected_size() == 0


def test_disabled_cache_keeps_unfinished_kv_and_frees_finished_kv():
    allocator, cache = make(disable=True)
    req = running_req(allocator, "a", [1, 2, 3], [4])
    slots = list(req.kv_indices)
    cache_unfinished_req(cache, req)
    assert req.kv_indices == slots
    cache_finished_req(cache, req)
    assert req.kv_indices == []
    assert allocator.available_size() == 32


def test_fill_ids_prefix_equals_slicing_fill_ids():
    req = Req(rid="r", origin_input_ids=[1, 2, 3], output_ids=[4, 5])
    for n in range(-6, 7):
        assert fill_ids_prefix(req, n) == req.fill_ids[:n], n
    assert fill_ids_prefix(req, 2) is not req.origin_input_ids
