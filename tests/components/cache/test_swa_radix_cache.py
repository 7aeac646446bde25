import pytest

import schedkit.components.cache.event_recorder as event_recorder
from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.swa_radix_cache import SWARadixCache
from schedkit.core.component import component_name
from schedkit.kv_events.hashing import page_hashes
from schedkit.kv_events.structs import AllBlocksCleared, BlockRemoved, BlockStored
from tests.components.cache.cache_events import (
    removed_hashes,
    stored_hashes,
    stored_links,
    stored_pages,
)


def make_cache(window=4, page_size=1, capacity=None, **kwargs):
    capacity = 32 * page_size if capacity is None else capacity
    cache = SWARadixCache(
        sliding_window_size=window,
        page_size=page_size,
        capacity=capacity,
        enable_kv_cache_events=True,
        **kwargs,
    )
    assert cache.take_events() == [AllBlocksCleared()]
    return cache


def test_registered_as_swa_radix_cache():
    assert component_name(SWARadixCache) == "swa_radix_cache"


# Reference scenarios (spec section 3).


@pytest.mark.parametrize("page_size", [1, 2])
def test_scenario_3_tombstones_are_silent_and_full_eviction_removes_everything(page_size):
    cache = make_cache(window=4, page_size=page_size)
    cache.insert([1, 2, 3, 4])
    first = cache.take_events()
    assert [p[0] for p in stored_pages(first)] == [1, 2, 3, 4][::page_size]
    assert all(isinstance(e, BlockStored) for e in first)

    cache.insert([1, 2, 3, 4, 5, 6])
    second = cache.take_events()
    assert stored_pages(second) == [[5, 6][i : i + page_size] for i in range(0, 2, page_size)]

    assert cache.evict(num_tokens=0, swa_num_tokens=1) == (0, 4)
    assert not [e for e in cache.take_events() if isinstance(e, BlockRemoved)]
    assert cache.swa_total_size() == 2 and cache.total_size() == 6

    assert cache.evict(num_tokens=1, swa_num_tokens=0) == (6, 2)
    removed = removed_hashes(cache.take_events())
    assert sorted(removed) == sorted(stored_hashes(first + second))
    assert cache.allocator.available_size() == cache.allocator.size
    assert cache.swa_allocator.available_size() == cache.swa_allocator.size


@pytest.mark.parametrize("page_size", [1, 2])
def test_scenario_4_a_branch_links_to_the_shared_prefix(page_size):
    cache = make_cache(window=4, page_size=page_size)
    cache.insert([1, 2, 3, 4])
    cache.take_events()
    assert cache.insert([1, 2, 5, 6]) == 2
    events = cache.take_events()
    assert len(stored_pages(events)) == 2 // page_size
    assert stored_pages(events)[0] == [5, 6][:page_size]
    assert stored_links(events)[0][1] == page_hashes([1, 2], page_size)[-1]


def test_events_off_records_nothing_and_never_hashes(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("hashed with events off")

    monkeypatch.setattr(event_recorder, "chain_packed", fail)
    monkeypatch.setattr(event_recorder, "chain_ids", fail)
    cache = SWARadixCache(sliding_window_size=2, capacity=16)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6])
    cache.evict(0, 2)
    cache.evict(10, 0)
    cache.reset()
    assert cache.take_events() == []


# Matching across tombstones.


def test_a_tombstone_breaks_a_match_unless_a_full_window_follows():
    narrow = make_cache(window=2)
    wide = make_cache(window=4)
    for cache in (narrow, wide):
        cache.insert([1, 2, 3, 4])
        cache.insert([1, 2, 3, 4, 5, 6])
        cache.evict(0, 1)  # tombstones [1, 2, 3, 4]
    result = narrow.match_prefix([1, 2, 3, 4, 5, 6])
    assert result.prefix_len == 6
    assert result.swa_indices[:4] == [None] * 4
    assert None not in result.swa_indices[4:]
    assert narrow.match_prefix([1, 2, 3, 4]).prefix_len == 0
    miss = wide.match_prefix([1, 2, 3, 4, 5, 6])
    assert (miss.prefix_len, miss.last_node) == (0, wide.root)


def test_without_tombstones_any_prefix_matches():
    cache = make_cache(window=8)
    cache.insert([1, 2, 3])
    result = cache.match_prefix([1, 2, 9])
    assert result.prefix_len == 2
    assert result.swa_indices == cache.match_prefix([1, 2, 3]).swa_indices[:2]


# Eviction.


def test_sliding_window_eviction_of_a_leaf_deletes_it():
    cache = make_cache(window=2)
    cache.insert([1, 2])
    cache.take_events()
    assert cache.evict(0, 1) == (2, 2)
    assert removed_hashes(cache.take_events()) == page_hashes([1, 2], 1)
    assert cache.total_size() == 0


def test_a_locked_tombstone_outlives_its_children_until_unlocked():
    cache = make_cache(window=2)
    cache.insert([1, 2])
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6])
    cache.take_events()
    branch = cache.match_prefix([1, 2, 5, 6]).last_node
    uuid = cache.inc_lock_ref(branch)
    assert cache.full_protected_size() == 4 and cache.swa_protected_size() == 2
    # [1, 2] is the least recently used: tombstoned; leaf [3, 4] deleted.
    assert cache.evict(0, 100) == (2, 4)
    assert removed_hashes(cache.take_events()) == page_hashes([1, 2, 3, 4], 1)[2:]
    assert cache.evict(100, 0) == (0, 0)
    cache.dec_lock_ref(branch, uuid)
    assert cache.full_protected_size() == 0 and cache.swa_protected_size() == 0
    assert cache.evict(1, 0) == (4, 2)
    assert sorted(removed_hashes(cache.take_events())) == sorted(page_hashes([1, 2, 5, 6], 1))


def test_insert_without_value_evicts_in_both_pools():
    cache = make_cache(window=2, capacity=8, swa_capacity=2)
    cache.insert([1, 2])
    cache.take_events()
    cache.insert([3, 4])
    events = cache.take_events()
    assert removed_hashes(events) == page_hashes([1, 2], 1)
    assert stored_pages(events) == [[3], [4]]
    assert cache.swa_allocator.available_size() == 0


# Inserting with explicit slots: tombstones, revival, ownership.


def test_tokens_without_sliding_window_slots_are_stored_as_a_tombstone():
    cache = make_cache(window=2)
    full = cache.allocator.alloc(4)
    swa = cache.swa_allocator.alloc(2)
    assert cache.insert([1, 2, 3, 4], full, [None, None, *swa]) == 0
    assert stored_pages(cache.take_events()) == [[1], [2], [3], [4]]
    assert (cache.total_size(), cache.swa_total_size()) == (4, 2)
    result = cache.match_prefix([1, 2, 3, 4])
    assert result.device_indices == full
    assert result.swa_indices == [None, None, *swa]


def test_a_suffix_without_a_live_window_is_not_stored():
    cache = make_cache(window=2, capacity=8)
    full = cache.allocator.alloc(2)
    swa = cache.swa_allocator.alloc(1)
    assert cache.insert([1, 2], full, [swa[0], None]) == 0
    assert cache.take_events() == []
    assert cache.total_size() == 0
    assert cache.allocator.available_size() == 8
    assert cache.swa_allocator.available_size() == 8


def test_reviving_a_tombstone_is_silent_and_takes_the_new_window_slots():
    cache = make_cache(window=4, capacity=16)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 3, 4, 5, 6])
    cache.evict(0, 1)
    cache.take_events()
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).prefix_len == 0
    full = cache.allocator.alloc(6)
    swa = cache.swa_allocator.alloc(6)
    assert cache.insert([1, 2, 3, 4, 5, 6], full, swa) == 6
    assert cache.take_events() == []
    result = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert result.prefix_len == 6
    assert result.swa_indices[:4] == swa[:4]
    assert result.device_indices != full  # the cache kept its full slots; the copies were freed
    assert cache.allocator.available_size() == 10
    assert cache.swa_allocator.available_size() == 10


@pytest.mark.parametrize("page_size", [1, 2])
def test_partial_revival_splits_the_tombstone(page_size):
    cache = make_cache(window=2, page_size=page_size, capacity=16)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 3, 4, 5, 6])
    cache.evict(0, 1)  # tombstones [1, 2, 3, 4]
    cache.take_events()
    own = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert own.swa_indices[:4] == [None] * 4
    # The request still has sliding-window slots for the tokens after the first page only.
    swa = cache.swa_allocator.alloc(4 - page_size)
    given = [None] * page_size + swa + own.swa_indices[4:]
    assert cache.insert([1, 2, 3, 4, 5, 6], own.device_indices, given) == 6
    assert cache.take_events() == []
    result = cache.match_prefix([1, 2, 3, 4])
    assert result.prefix_len == 4
    assert result.swa_indices == [None] * page_size + swa
    assert cache.swa_total_size() == 6 - page_size
    assert cache.swa_allocator.available_size() == 16 - (6 - page_size)
    assert cache.allocator.available_size() == 16 - 6


# Locks.


def test_lock_protects_full_kv_to_the_root_and_the_window_only():
    cache = make_cache(window=2)
    cache.insert([1, 2])
    cache.insert([1, 2, 3, 4])
    leaf = cache.match_prefix([1, 2, 3, 4]).last_node
    uuid = cache.inc_lock_ref(leaf)
    assert uuid is not None
    assert (cache.full_protected_size(), cache.full_evictable_size()) == (4, 0)
    assert (cache.swa_protected_size(), cache.swa_evictable_size()) == (2, 2)
    assert cache.evict(0, 100) == (0, 2)  # only [1, 2] may lose its window
    cache.dec_lock_ref(leaf, uuid)
    assert (cache.full_protected_size(), cache.swa_protected_size()) == (0, 0)
    assert (cache.full_evictable_size(), cache.swa_evictable_size()) == (4, 2)


def test_unlock_still_works_after_the_locked_node_is_split():
    cache = make_cache(window=3)
    cache.insert([1, 2, 3, 4, 5, 6])
    node = cache.match_prefix([1, 2, 3, 4, 5, 6]).last_node
    uuid = cache.inc_lock_ref(node)
    cache.insert([1, 2, 3, 9])  # splits the locked node into [1, 2, 3] and [4, 5, 6]
    assert node.key == [4, 5, 6]
    assert cache.swa_protected_size() == 6
    cache.dec_lock_ref(node, uuid)
    assert (cache.full_protected_size(), cache.swa_protected_size()) == (0, 0)
    assert cache.swa_evictable_size() == 7


def test_a_window_over_a_tombstone_cannot_be_locked():
    cache = make_cache(window=2)
    cache.insert([1, 2])
    cache.insert([1, 2, 3])
    cache.evict(0, 1)  # tombstones [1, 2]
    assert cache.match_prefix([1, 2, 3]).last_node is cache.root
    tombstone = cache.root.children[1]
    assert tombstone.tombstone
    with pytest.raises(ValueError, match="tombstone lies within its sliding window"):
        cache.inc_lock_ref(tombstone.children[3])
    assert cache.full_protected_size() == 0


def test_unlock_with_a_wrong_token_is_rejected_without_changes():
    cache = make_cache(window=1)
    cache.insert([1, 2])
    cache.insert([1, 2, 3])
    leaf = cache.match_prefix([1, 2, 3]).last_node
    uuid = cache.inc_lock_ref(leaf)
    for wrong in (uuid + 1000, None):
        with pytest.raises(ValueError, match="does not match a lock"):
            cache.dec_lock_ref(leaf, wrong)
    assert (cache.full_protected_size(), cache.swa_protected_size()) == (3, 1)
    cache.dec_lock_ref(leaf, uuid)
    with pytest.raises(ValueError, match="holds no lock"):
        cache.dec_lock_ref(leaf, uuid)


def test_a_lock_shorter_than_the_window_covers_the_whole_path():
    cache = make_cache(window=8)
    cache.insert([1, 2])
    cache.insert([1, 2, 3])
    leaf = cache.match_prefix([1, 2, 3]).last_node
    assert cache.inc_lock_ref(leaf) is None
    assert cache.swa_protected_size() == 3
    with pytest.raises(ValueError, match="is not on"):
        cache.dec_lock_ref(leaf, 12345)
    cache.dec_lock_ref(leaf)
    assert cache.swa_protected_size() == 0


# Reset and configuration.


def test_reset_frees_both_pools():
    cache = make_cache(window=2, capacity=8, swa_capacity=4)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5])
    cache.evict(0, 1)
    cache.take_events()
    cache.reset()
    assert cache.take_events() == [AllBlocksCleared()]
    assert cache.allocator.available_size() == 8
    assert cache.swa_allocator.available_size() == 4
    assert (cache.total_size(), cache.swa_total_size()) == (0, 0)


def test_disabled_cache_frees_both_kinds_of_slot():
    cache = SWARadixCache(sliding_window_size=2, capacity=4, disable=True)
    full = cache.allocator.alloc(2)
    swa = cache.swa_allocator.alloc(1)
    assert cache.insert([1, 2], full, [None, swa[0]]) == 0
    assert cache.allocator.available_size() == 4
    assert cache.swa_allocator.available_size() == 4
    assert cache.match_prefix([1, 2]).prefix_len == 0
    assert cache.evict(2, 2) == (0, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sliding_window_size": 0, "capacity": 4}, "sliding_window_size must be"),
        ({"sliding_window_size": 2}, "needs a KV pool"),
        (
            {"sliding_window_size": 2, "page_size": 2, "capacity": 4,
             "swa_allocator": TokenToKVPoolAllocator(size=4)},
            "swa_allocator.page_size is 1",
        ),
    ],
)  # fmt: skip
def test_bad_configuration_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SWARadixCache(**kwargs)


def test_value_and_swa_value_go_together():
    cache = make_cache()
    with pytest.raises(ValueError, match="swa_value= needs value="):
        cache.insert([1], None, [0])
    with pytest.raises(ValueError, match="one slot per token"):
        cache.insert([1, 2], [0, 1], [0])


@pytest.mark.parametrize(
    ("policy", "expected"), [("lru", [2, 1]), ("fifo", [1, 2]), ("lfu", [2, 1])]
)
def test_full_eviction_follows_the_eviction_policy(policy, expected):
    cache = make_cache(window=1, eviction_policy=policy)
    cache.insert([1, 1])
    cache.insert([2, 2])
    cache.match_prefix([1, 1])
    first = {page_hashes([t, t], 1)[0]: t for t in (1, 2)}
    cache.take_events()
    order = []
    for _ in range(2):
        cache.evict(1)
        order += [first[h] for h in removed_hashes(cache.take_events()) if h in first]
    assert order == expected


def test_priority_policy_keeps_high_priority_prefixes_longest():
    cache = make_cache(window=1, eviction_policy="priority")
    cache.insert([1, 1], priority=3)
    cache.insert([2, 2], priority=1)
    cache.match_prefix([2, 2])
    cache.take_events()
    cache.evict(1)
    assert removed_hashes(cache.take_events()) == page_hashes([2, 2], 1)


def test_scheduler_hands_full_kv_only_and_the_cache_adds_window_slots():
    cache = make_cache(window=2, capacity=16, swa_capacity=4)
    full = cache.allocator.alloc(6)
    assert cache.insert([1, 2, 3, 4, 5, 6], full) == 0
    # The pool holds 4 sliding-window slots: the last window gets live slots, the rest is a
    # tombstone (one BlockStored for the pages of both nodes).
    assert stored_pages(cache.take_events()) == [[t] for t in range(1, 7)]
    assert (cache.total_size(), cache.swa_total_size()) == (6, 2)
    result = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert result.prefix_len == 6 and result.swa_indices[:4] == [None] * 4
    token = cache.inc_lock_ref(result.last_node)
    assert token is not None
    cache.dec_lock_ref(result.last_node, token)
    assert cache.swa_protected_size() == 0 and cache.protected_size() == 0


def test_token_ids_that_cannot_be_hashed_leave_the_cache_unchanged():
    cache = make_cache(window=2, capacity=8)
    with pytest.raises(
        ValueError, match=r"token ids must be integers in \[0, 9223372036854775807\]"
    ):
        cache.insert([1, 2**63, 3])
    assert cache.total_size() == 0 and cache.take_events() == []
    assert cache.allocator.available_size() == 8 == cache.swa_allocator.available_size()
