"""SWA cache fine points as SGLang's SWARadixCache: splitting a new leaf at the window on insert
(SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT) and releasing a lock's window part early
(dec_swa_lock_only)."""

import pytest
from schedkit.components.cache.req_locks import release_swa_prefix_lock, unlock_req
from schedkit.components.cache.swa_radix_cache import SWARadixCache

from schedkit.core.schedule_batch import Req


def make_cache(window=4, page_size=1, **kwargs):
    return SWARadixCache(
        sliding_window_size=window, page_size=page_size, capacity=64 * page_size, **kwargs
    )


@pytest.mark.parametrize(("page_size", "window", "tail"), [(1, 4, 4), (2, 3, 4), (4, 4, 4)])
def test_split_leaf_on_insert_caps_the_leaf_at_one_page_aligned_window(page_size, window, tail):
    cache = make_cache(window=window, page_size=page_size, split_leaf_on_insert=True)
    cache.insert(list(range(1, 17)))
    leaf = cache.match_prefix(list(range(1, 17))).last_node
    assert len(leaf.key) == tail and len(leaf.parent.key) == 16 - tail
    cache.inc_lock_ref(leaf)
    # The lock protects one window of sliding-window KV, not the whole insert.
    assert cache.swa_protected_size() == tail and cache.full_protected_size() == 16
    cache.sanity_check()


def test_without_the_option_the_leaf_stays_whole_and_its_lock_protects_all_of_it():
    cache = make_cache(window=4)
    cache.insert(list(range(1, 17)))
    leaf = cache.match_prefix(list(range(1, 17))).last_node
    assert len(leaf.key) == 16
    cache.inc_lock_ref(leaf)
    assert cache.swa_protected_size() == 16


def test_a_short_leaf_is_not_split():
    cache = make_cache(window=4, split_leaf_on_insert=True)
    cache.insert([1, 2, 3])
    assert len(cache.match_prefix([1, 2, 3]).last_node.key) == 3


def locked(cache, tokens):
    cache.insert(tokens)
    node = cache.match_prefix(tokens).last_node
    return node, cache.inc_lock_ref(node)


def test_dec_swa_lock_only_tombstones_a_leaf_and_keeps_its_full_kv_locked():
    cache = make_cache(window=4)
    node, token = locked(cache, list(range(1, 9)))
    swa_free = cache.swa_allocator.available_size()
    cache.dec_swa_lock_only(node, token)
    assert node.swa_value is None  # the leaf's sliding-window KV is freed at once
    assert cache.swa_allocator.available_size() == swa_free + 8
    assert cache.swa_protected_size() == 0 and cache.full_protected_size() == 8
    assert cache.evict(num_tokens=100) == (0, 0)  # still locked in full
    cache.sanity_check()
    cache.dec_lock_ref(node, token, skip_swa=True)
    assert cache.full_protected_size() == 0
    assert cache.evict(num_tokens=100) == (8, 0)
    cache.sanity_check()


def test_dec_swa_lock_only_on_an_inner_node_makes_its_window_evictable():
    cache = make_cache(window=4)
    cache.insert(list(range(1, 9)))
    cache.insert([*range(1, 9), 50, 51])  # [1..8] is now an inner node
    node, token = cache.match_prefix(list(range(1, 9))).last_node, None
    token = cache.inc_lock_ref(node)
    evictable = cache.swa_evictable_size()
    cache.dec_swa_lock_only(node, token)
    assert node.swa_value is not None and cache.swa_evictable_size() == evictable + 8
    assert cache.evict(swa_num_tokens=8)[1] >= 8 and node.swa_value is None  # now a tombstone
    cache.dec_lock_ref(node, token, skip_swa=True)
    cache.sanity_check()


def test_dec_swa_lock_only_twice_is_refused():
    cache = make_cache(window=4)
    node, token = locked(cache, list(range(1, 9)))
    cache.dec_swa_lock_only(node, token)
    with pytest.raises(ValueError, match="does not match a window lock"):
        cache.dec_swa_lock_only(node, token)


def test_a_request_releases_its_window_early_and_its_full_lock_at_the_end():
    cache = make_cache(window=4)
    node, token = locked(cache, list(range(1, 9)))
    req = Req(rid="r", origin_input_ids=list(range(1, 9)), last_node=node, swa_uuid_for_lock=token)
    release_swa_prefix_lock(cache, req)
    release_swa_prefix_lock(cache, req)  # once per lock: the second call does nothing
    assert req.swa_prefix_lock_released and cache.swa_protected_size() == 0
    unlock_req(cache, req)
    assert not req.swa_prefix_lock_released and cache.full_protected_size() == 0
    cache.sanity_check()
