"""A request's cache keys, and the contract between the radix tree's generic
``cache_finished_req``/``cache_unfinished_req`` and RadixCache's fast path: on random
workloads both leave the same tree, events, request slots and free pool."""

import random
from array import array

import pytest

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.cache_keys import (
    fill_ids_prefix,
    fill_ids_slice,
    prefix_match_key,
)
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.cache.radix_tree import RadixTree
from schedkit.components.scheduler.batching import KVSlots
from schedkit.core.schedule_batch import Req
from schedkit.kv_events.structs import EventBatch, encode_batch


def generic(cache):
    """The tree's generic pair (what the SWA cache runs), which uses only the prefix-cache
    protocol."""
    return (
        lambda req: RadixTree.cache_finished_req(cache, req),
        lambda req: RadixTree.cache_unfinished_req(cache, req),
    )


def methods(cache):
    """The radix cache's own methods, which insert from the request's locked prefix node."""
    return cache.cache_finished_req, cache.cache_unfinished_req


@pytest.fixture(params=[generic, methods], ids=["generic", "radix-fast-path"])
def bind(request):
    return request.param


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


def test_finished_req_goes_into_the_cache_and_frees_duplicates(bind):
    allocator, cache = make()
    finish, _ = bind(cache)
    first = running_req(allocator, "a", [1, 2, 3, 4, 5], [6])
    finish(first)
    assert first.kv_indices == [] and first.last_node is None and first.prefix_len == 0
    assert cache.total_size() == 5
    assert cache.match_prefix([1, 2, 3, 4, 5]).prefix_len == 5
    # A second request computed the same 3 leading tokens again: its copies are freed.
    second = running_req(allocator, "b", [1, 2, 3, 9], [8])
    free_before = allocator.available_size()
    finish(second)
    assert cache.total_size() == 6  # 5 + the new token 9 (the last token 8 has no KV)
    assert allocator.available_size() == free_before + 3
    assert allocator.available_size() + cache.total_size() == 32


def test_unfinished_req_takes_cache_slots_and_moves_its_lock(bind):
    allocator, cache = make()
    finish, publish = bind(cache)
    first = running_req(allocator, "a", [1, 2, 3, 4], [5])
    finish(first)
    cached_slots = cache.match_prefix([1, 2, 3, 4]).device_indices

    req = running_req(allocator, "b", [1, 2, 3, 7, 8], [9])
    own_tail = req.kv_indices[3:]
    publish(req)
    assert req.kv_indices == cached_slots[:3] + own_tail
    assert req.prefix_len == 5
    assert req.last_node is cache.match_prefix([1, 2, 3, 7, 8]).last_node
    assert cache.protected_size() == 5 and cache.evictable_size() == 1  # token 4
    # Publishing again after more tokens moves the lock to the deeper node.
    more = allocator.alloc(1)
    req.output_ids.append(10)
    req.kv_indices = [*req.kv_indices, *more]
    publish(req)
    assert req.prefix_len == 6
    assert cache.protected_size() == 6
    finish(req)
    assert cache.protected_size() == 0
    assert allocator.available_size() + cache.total_size() == 32


def test_unfinished_req_keeps_its_partial_page(bind):
    allocator, cache = make(size=32, page_size=4)
    finish, publish = bind(cache)
    req = running_req(allocator, "a", list(range(1, 11)), [11])  # 10 tokens with KV
    tail = req.kv_indices[8:]
    publish(req)
    assert req.prefix_len == 8
    assert req.kv_indices[8:] == tail
    assert len(req.kv_indices) == 10
    assert cache.total_size() == 8
    finish(req)
    # The partial page went back to the pool.
    assert allocator.available_size() == 32 - 8
    assert cache.protected_size() == 0


def test_disabled_cache_keeps_unfinished_kv_and_frees_finished_kv(bind):
    allocator, cache = make(disable=True)
    finish, publish = bind(cache)
    req = running_req(allocator, "a", [1, 2, 3], [4])
    slots = list(req.kv_indices)
    publish(req)
    assert req.kv_indices == slots
    finish(req)
    assert req.kv_indices == []
    assert allocator.available_size() == 32


def test_fill_ids_prefix_equals_slicing_fill_ids():
    req = Req(rid="r", origin_input_ids=[1, 2, 3], output_ids=[4, 5])
    for n in range(-6, 7):
        assert fill_ids_prefix(req, n) == req.fill_ids[:n], n
    assert fill_ids_prefix(req, 2) is not req.origin_input_ids


@pytest.mark.parametrize("prompt", [[1, 2, 3], array("I", [1, 2, 3]), array("l", [1, 2, 3])])
@pytest.mark.parametrize("output", [[4, 5], [4, 2**40]])
def test_fill_ids_slice_equals_slicing_fill_ids(prompt, output):
    req = Req(rid="r", origin_input_ids=prompt, output_ids=output)
    packed = type(prompt) is array and prompt.typecode == "I"
    for start in range(6):
        for stop in range(start, 6):
            key = fill_ids_slice(req, start, stop)
            assert list(key) == req.fill_ids[start:stop], (start, stop)
            if stop <= 3:  # a packed prompt's own tokens stay packed, another kind is listed
                assert type(key) is (array if packed else list)


def test_unfinished_req_uses_pages_another_request_cached_meanwhile(bind):
    allocator, cache = make(size=32, page_size=2)
    finish, publish = bind(cache)
    first = running_req(allocator, "a", [1, 2, 3, 4, 5])
    second = running_req(allocator, "b", [1, 2, 3, 4, 6])  # prefilled before a was cached
    publish(first)
    theirs = list(second.kv_indices)
    free_before = allocator.available_size()
    publish(second)
    assert second.kv_indices == first.kv_indices[:4]  # the cache's slots replace its own
    assert second.last_node is first.last_node and second.prefix_len == 4
    assert allocator.available_size() == free_before + 4  # its two duplicate pages
    assert not set(theirs) & set(second.kv_indices)
    finish(first)
    finish(second)
    assert cache.protected_size() == 0
    assert allocator.available_size() + cache.total_size() == 32


def run_requests(seed: int, page_size: int, implementation, pack: bool = False) -> dict:
    """Admit, prefill, decode and finish random requests (shared prefixes, two namespaces,
    identical prompts in flight together, a pool small enough to evict; prompts packed as
    ``array('I')`` with ``pack``) on a radix cache with KV events; returns everything
    observable afterwards (the events as they go on the wire)."""
    rng = random.Random(seed)
    allocator = TokenToKVPoolAllocator(size=96 * page_size, page_size=page_size)
    cache = RadixCache(
        allocator=allocator, page_size=page_size, enable_kv_cache_events=True, eviction_policy="lfu"
    )
    kv = KVSlots(allocator, cache, page_size)
    finish, publish = implementation(cache)
    prefixes = [[rng.randrange(1, 50) for _ in range(rng.randrange(0, 12))] for _ in range(4)]
    running, seen = [], []
    for step in range(120):
        if len(running) < 4 and rng.random() < 0.5:
            prompt = rng.choice(prefixes) + [
                rng.randrange(1, 50) for _ in range(rng.randrange(1, 9))
            ]
            ids = array("I", prompt) if pack else prompt
            req = Req(rid=str(step), origin_input_ids=ids, extra_key=rng.choice([None, "x"]))
            req.priority = rng.randrange(3)
            match = cache.match_prefix(fill_ids_prefix(req, -1))
            req.last_node, req.prefix_len = match.last_node, match.prefix_len
            req.swa_uuid_for_lock = cache.inc_lock_ref(match.last_node)
            req.kv_indices = list(match.device_indices)
            assert kv.extend(req, len(prompt) - match.prefix_len)
            req.output_ids.append(rng.randrange(1, 50))
            publish(req)
            running.append(req)
            seen.append((req.rid, list(req.kv_indices), req.prefix_len, req.swa_uuid_for_lock))
        for req in list(running):
            if rng.random() < 0.3:
                running.remove(req)
                finish(req)
            else:
                assert kv.extend(req, 1)
                req.output_ids.append(rng.randrange(1, 50))
                if rng.random() < 0.3:
                    publish(req)
            seen.append((req.rid, list(req.kv_indices), req.prefix_len))
    for req in running:
        finish(req)
    nodes, stack = [], [(cache.root, ())]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            nodes.append(child)
            stack.append((child, (*path, *child.key)))
    rank = sorted(nodes, key=lambda n: n.last_access_time)
    return {
        "events": encode_batch(EventBatch(0.0, cache.take_events())),
        "requests": seen,
        "tree": sorted(
            (
                tuple(n.key),
                tuple(n.value),
                n.lock_ref,
                n.hit_count,
                n.priority,
                rank.index(n),
                n.namespace,
            )
            for n in nodes
        ),
        "free": sorted(allocator._free_pages),
    }


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("seed", range(6))
def test_radix_methods_leave_the_same_state_as_the_generic_functions(seed, page_size):
    expected = run_requests(seed, page_size, generic)
    assert any(isinstance(e, tuple) for e in expected["requests"])
    assert run_requests(seed, page_size, methods) == expected
    assert run_requests(seed, page_size, methods, pack=True) == expected
    assert run_requests(seed, page_size, generic, pack=True) == expected


def test_prefix_match_key_is_the_whole_pages_of_all_but_the_last_token():
    req = Req(rid="r", origin_input_ids=[1, 2, 3, 4, 5], output_ids=[6, 7])
    assert prefix_match_key(req, 1) == [1, 2, 3, 4, 5, 6]
    assert prefix_match_key(req, 4) == [1, 2, 3, 4]
    assert prefix_match_key(req, 8) == []
    namespaced = Req(rid="n", origin_input_ids=[1, 2, 3], extra_key="lora-a")
    assert prefix_match_key(namespaced, 2).namespace == ("lora-a", None)
