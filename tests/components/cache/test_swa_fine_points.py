"""SWA cache fine points as SGLang's SWARadixCache: splitting a new leaf at the window on insert
(SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT) and releasing a lock's window part early
(dec_swa_lock_only)."""

import pytest

from schedkit.components.cache.req_locks import release_swa_prefix_lock, unlock_req
from schedkit.components.cache.swa_radix_cache import SWARadixCache, bigram_key
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


def eagle(window=4, page_size=1, capacity=64):
    return SWARadixCache(
        sliding_window_size=window, page_size=page_size, capacity=capacity, is_eagle=True
    )


def test_bigram_key_is_sglangs():
    assert bigram_key([1, 2, 3, 4]) == [(1, 2), (2, 3), (3, 4)]
    assert bigram_key([7]) == [] and bigram_key([]) == []
    assert bigram_key([(1, 2)]) == [(1, 2)]  # already bigrams


def test_eagle_keys_are_bigrams_and_the_last_tokens_slot_is_freed():
    cache = eagle()
    slots = cache.allocator.alloc(8)
    cache.insert(list(range(1, 9)), slots)
    assert cache.total_size() == 7  # 7 bigrams
    assert slots[7] not in cache.all_values_flatten()
    assert cache.allocator.available_size() == 64 - 7
    assert cache.match_prefix(list(range(1, 9))).device_indices == slots[:7]
    # [1, 2, 3, 9]: bigrams (1, 2), (2, 3) match, (3, 9) does not.
    assert cache.match_prefix([1, 2, 3, 9]).prefix_len == 2
    cache.sanity_check()


def test_eagle_tokens_sharing_a_prefix_differ_at_the_bigram_that_crosses_it():
    cache = eagle()
    cache.insert([1, 2, 3])
    assert cache.match_prefix([1, 2, 4]).prefix_len == 1  # (1, 2) only
    assert cache.match_prefix([1, 2, 3, 4]).prefix_len == 2


def test_eagle_pages_align_on_bigrams():
    cache = eagle(page_size=2)
    cache.insert(list(range(1, 7)))  # 5 bigrams: 2 whole pages kept
    assert cache.total_size() == 4
    assert cache.match_prefix(list(range(1, 7))).prefix_len == 4


def test_eagle_request_caching_keeps_the_request_slot_of_its_last_kv_token():
    cache = eagle(capacity=32)
    req = Req(rid="r", origin_input_ids=list(range(1, 7)), output_ids=[7])
    req.kv_indices = cache.allocator.alloc(6)  # tokens 1..6 have KV
    cache.cache_unfinished_req(req)
    assert cache.total_size() == 5  # bigrams (1,2)..(5,6)
    assert req.prefix_len == 5 and req.kv_indices[5] not in cache.all_values_flatten()
    cache.cache_finished_req(req)
    assert cache.total_size() == 5 and cache.protected_size() == 0
    assert cache.allocator.available_size() == 32 - 5  # the last token's slot came back
    cache.sanity_check()


def test_eagle_with_kv_events_is_refused():
    with pytest.raises(ValueError, match="is_eagle with enable_kv_cache_events is not supported"):
        SWARadixCache(sliding_window_size=4, capacity=8, is_eagle=True, enable_kv_cache_events=True)


def test_eagle_frees_a_pages_unaligned_tail_and_last_slot_together():
    cache = eagle(page_size=4, capacity=64)
    req = Req(rid="r", origin_input_ids=list(range(1, 11)), output_ids=[11])
    req.kv_indices = cache.allocator.alloc(12)[:10]  # slots 8 and 9 share the third page
    cache.cache_unfinished_req(req)
    assert cache.total_size() == 8 and req.prefix_len == 8
    cache.cache_finished_req(req)
    assert cache.total_size() == 8
    assert cache.allocator.available_size() == 64 - 8
    cache.sanity_check()
