from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedkit.components.cache.event_recorder as event_recorder
from schedkit.components.cache.allocator import OutOfKVSlotsError, TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.cache.radix_tree import RadixKey, match_len
from schedkit.core.component import component_name
from schedkit.kv_events.hashing import digest_to_int, page_hashes, published_page_hashes
from schedkit.kv_events.structs import AllBlocksCleared, BlockStored, EventBatch, encode_batch
from tests.components.cache.cache_events import (
    removed_hashes,
    stored_hashes,
    stored_links,
    stored_pages,
)


def make_cache(page_size=1, capacity=None, **kwargs):
    capacity = 64 * page_size if capacity is None else capacity
    cache = RadixCache(
        page_size=page_size, capacity=capacity, enable_kv_cache_events=True, **kwargs
    )
    assert cache.take_events() == [AllBlocksCleared()]
    return cache


def held_slots(cache):
    slots, stack = [], list(cache.root.children.values())
    while stack:
        node = stack.pop()
        slots += node.value
        stack.extend(node.children.values())
    return slots


def test_registered_as_radix_cache():
    assert component_name(RadixCache) == "radix_cache"


# Reference scenarios (spec section 3).


@pytest.mark.parametrize("page_size", [1, 2, 3])
def test_scenario_1_insert_announces_each_new_page(page_size):
    cache = make_cache(page_size)
    assert cache.insert([1, 2, 3, 4, 5]) == 0
    events = cache.take_events()
    assert events and all(isinstance(e, BlockStored) for e in events)
    for e in events:
        assert len(e.token_ids) == e.block_size * len(e.block_hashes)
        assert e.block_size == page_size
        assert e.lora_id is None
        assert e.medium == "GPU"
    full = 5 - 5 % page_size
    assert [t for e in events for t in e.token_ids] == [1, 2, 3, 4, 5][:full]
    assert stored_hashes(events) == page_hashes([1, 2, 3, 4, 5], page_size)
    assert len(events) == 1  # one node, one event
    assert events[0].parent_block_hash is None


@pytest.mark.parametrize("page_size", [1, 2])
def test_scenario_1_events_off_records_nothing(page_size):
    cache = RadixCache(page_size=page_size, capacity=16)
    cache.insert([1, 2, 3, 4, 5])
    assert cache.take_events() == []


@pytest.mark.parametrize("page_size", [1, 2])
def test_scenario_2_evicted_hashes_equal_stored_hashes(page_size):
    cache = make_cache(page_size)
    cache.insert([1, 2, 3, 4])
    stored_list = stored_hashes(cache.take_events())
    assert len(stored_list) == 4 // page_size
    assert cache.evict(4) == 4
    events = cache.take_events()
    assert sorted(removed_hashes(events)) == sorted(stored_list)
    assert cache.total_size() == 0


# Matching, inserting, splitting.


def test_match_prefix_returns_slots_of_the_longest_cached_prefix():
    cache = make_cache()
    cache.insert([1, 2, 3, 4])
    slots = cache.match_prefix([1, 2, 3, 4]).device_indices
    result = cache.match_prefix([1, 2, 3, 9, 9])
    assert result.prefix_len == 3
    assert result.device_indices == slots[:3]
    assert result.last_node.key == [1, 2, 3]  # split at the match end
    assert cache.match_prefix([7]).prefix_len == 0
    assert cache.match_prefix([]).last_node is cache.root


def test_split_emits_nothing_and_keeps_the_hash_chain():
    cache = make_cache()
    cache.insert([1, 2, 3, 4])
    first = stored_hashes(cache.take_events())
    cache.match_prefix([1, 2])  # splits [1,2,3,4] into [1,2] + [3,4]
    cache.insert([1, 2, 5])
    events = cache.take_events()
    assert len(events) == 1
    assert events[0].token_ids == [5]
    assert events[0].parent_block_hash == first[1]
    assert cache.evict(100) == 5
    assert sorted(removed_hashes(cache.take_events())) == sorted(first + stored_hashes(events))


def test_paged_matching_stops_at_the_first_differing_page():
    cache = make_cache(page_size=2)
    cache.insert([1, 2, 3, 4, 5, 6])
    cache.take_events()
    assert cache.match_prefix([1, 2, 3, 4, 5, 9]).prefix_len == 4
    assert cache.match_prefix([1, 2, 3, 9]).prefix_len == 2
    assert cache.match_prefix([1, 2, 3]).prefix_len == 2  # partial page ignored
    assert cache.match_prefix([1, 9]).prefix_len == 0
    assert cache.take_events() == []


def test_insert_reports_the_cached_prefix_and_frees_duplicate_slots():
    cache = make_cache(capacity=16)
    pool = cache.allocator
    assert cache.insert([1, 2, 3], pool.alloc(3)) == 0
    assert pool.available_size() == 13
    # A second request computed the same prefix into its own slots: they are duplicates.
    assert cache.insert([1, 2, 3, 4], pool.alloc(4)) == 3
    assert pool.available_size() == 12
    assert cache.total_size() == 4
    assert stored_pages(cache.take_events()) == [[1], [2], [3], [4]]


def test_insert_keeps_the_caches_own_slots_from_a_match():
    cache = make_cache(capacity=16)
    pool = cache.allocator
    cache.insert([1, 2, 3])
    prefix = cache.match_prefix([1, 2, 3, 4, 5])
    value = prefix.device_indices + pool.alloc(2)
    assert cache.insert([1, 2, 3, 4, 5], value) == 3
    assert pool.available_size() == 11
    assert sorted(held_slots(cache)) == sorted(value)
    assert cache.match_prefix([1, 2, 3, 4, 5]).device_indices == value


def test_trailing_partial_page_is_not_stored_and_its_slots_are_freed():
    cache = make_cache(page_size=2, capacity=8)
    pool = cache.allocator
    slots = pool.alloc(4)
    assert cache.insert([1, 2, 3], slots[:3]) == 0
    assert cache.total_size() == 2
    assert pool.available_size() == 6  # the page of slots[2] came back
    assert [e.token_ids for e in cache.take_events()] == [[1, 2]]


def test_insert_rejects_a_value_of_the_wrong_length():
    cache = make_cache()
    with pytest.raises(ValueError, match="2 slots for 3 tokens"):
        cache.insert([1, 2, 3], [0, 1])


# Locking and eviction.


def test_lock_moves_tokens_between_evictable_and_protected():
    cache = make_cache()
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4])
    node = cache.match_prefix([1, 2, 3]).last_node
    assert cache.inc_lock_ref(node) == -3
    assert (cache.evictable_size(), cache.protected_size()) == (1, 3)
    assert cache.inc_lock_ref(node) == 0
    assert cache.evict(10) == 1  # only the unlocked [4]
    assert cache.match_prefix([1, 2, 3]).prefix_len == 3
    assert cache.dec_lock_ref(node) == 0
    assert cache.dec_lock_ref(node) == 3
    assert (cache.evictable_size(), cache.protected_size()) == (3, 0)
    assert cache.evict(10) == 3
    with pytest.raises(ValueError, match="holds no lock"):
        cache.dec_lock_ref(node)


def test_locking_an_evicted_node_is_rejected():
    cache = make_cache()
    cache.insert([1, 2])
    node = cache.match_prefix([1, 2]).last_node
    cache.evict(2)
    with pytest.raises(ValueError, match="no longer in the cache"):
        cache.inc_lock_ref(node)


def test_evict_takes_least_recently_used_leaves_first():
    cache = make_cache()
    for token in (1, 2, 3):
        cache.insert([token])
    cache.match_prefix([1])  # 1 is now the most recently used
    cache.take_events()
    order = []
    for _ in range(3):
        assert cache.evict(1) == 1
        order += removed_hashes(cache.take_events())
    assert order == [page_hashes([t], 1)[0] for t in (2, 3, 1)]


def test_a_parent_left_without_children_becomes_evictable():
    cache = make_cache()
    cache.insert([1, 2])
    cache.insert([1, 2, 3])
    cache.take_events()
    assert cache.evict(2) == 3
    removed = [e.block_hashes for e in cache.take_events()]
    hashes = page_hashes([1, 2, 3], 1)
    assert removed == [[hashes[2], *hashes[:2]]]  # child first, then the parent, merged
    assert cache.allocator.available_size() == 64


def test_evict_removes_whole_nodes_and_frees_their_slots():
    cache = make_cache(capacity=8)
    cache.insert([1, 2, 3, 4])
    assert cache.evict(1) == 4
    assert cache.allocator.available_size() == 8
    assert cache.evict(1) == 0


def test_insert_without_value_evicts_to_make_room():
    cache = make_cache(capacity=4)
    cache.insert([1, 2])
    cache.insert([3, 4])
    cache.match_prefix([3, 4])
    cache.take_events()
    cache.insert([5, 6])
    events = cache.take_events()
    assert removed_hashes(events) == page_hashes([1, 2], 1)
    assert stored_pages(events) == [[5], [6]]
    assert cache.match_prefix([3, 4]).prefix_len == 2


def test_insert_without_value_fails_cleanly_when_everything_is_locked():
    cache = make_cache(capacity=2)
    cache.insert([1, 2])
    cache.inc_lock_ref(cache.match_prefix([1, 2]).last_node)
    with pytest.raises(OutOfKVSlotsError, match="needs 1 KV slots"):
        cache.insert([3])
    assert cache.total_size() == 2
    assert cache.match_prefix([1, 2]).prefix_len == 2


# Reset, events off, namespaces, configuration.


def test_reset_frees_everything_and_announces_it():
    cache = make_cache(capacity=8)
    cache.insert([1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(node)
    cache.take_events()
    cache.reset()
    assert cache.take_events() == [AllBlocksCleared()]
    assert cache.allocator.available_size() == 8
    assert (cache.total_size(), cache.evictable_size(), cache.protected_size()) == (0, 0, 0)
    assert cache.match_prefix([1, 2, 3]).prefix_len == 0
    with pytest.raises(ValueError, match="no longer in the cache"):
        cache.inc_lock_ref(node)


def test_events_off_never_hashes(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("hashed with events off")

    monkeypatch.setattr(event_recorder, "chain_packed", fail)
    monkeypatch.setattr(event_recorder, "chain_ids", fail)
    cache = RadixCache(page_size=2, capacity=16)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6])
    cache.evict(100)
    cache.reset()
    assert cache.take_events() == []
    with pytest.raises(AssertionError, match="hashed"):
        make_cache().insert([1])


def test_namespaces_isolate_keys_and_namespace_the_published_hashes():
    cache = make_cache(page_size=2)
    cache.insert([1, 2, 3, 4])
    plain = cache.take_events()
    cache.insert(RadixKey([1, 2, 3, 4], cache_salt="tenant-a"))
    salted = cache.take_events()
    cache.insert(RadixKey([1, 2, 3, 4], extra_key="lora-x"))
    keyed = cache.take_events()
    assert stored_hashes(plain) == published_page_hashes([1, 2, 3, 4], 2)
    assert stored_hashes(salted) == published_page_hashes([1, 2, 3, 4], 2, cache_salt="tenant-a")
    assert stored_hashes(keyed) == published_page_hashes([1, 2, 3, 4], 2, extra_key="lora-x")
    assert salted[0].parent_block_hash is None and salted[0].cache_salt == "tenant-a"
    assert keyed[0].cache_salt is None and salted[0].lora_name is None
    # SGLang's default format: an extra_key alone publishes the plain chain.
    assert stored_hashes(keyed) == stored_hashes(plain)
    assert len({*stored_hashes(plain), *stored_hashes(salted)}) == 4
    # Equal tokens in another namespace share nothing; the same namespace shares its prefix.
    assert cache.match_prefix(RadixKey([1, 2, 3, 4], cache_salt="other")).prefix_len == 0
    assert cache.match_prefix(RadixKey([1, 2, 9, 9], cache_salt="tenant-a")).prefix_len == 2
    assert cache.match_prefix([1, 2, 3, 4]).prefix_len == 4
    cache.insert(RadixKey([1, 2, 5, 6], cache_salt="tenant-a"))
    branch = cache.take_events()
    assert stored_links(branch) == [
        (published_page_hashes([1, 2, 5, 6], 2, cache_salt="tenant-a")[1], stored_hashes(salted)[0])
    ]
    assert cache.evict(100) == 14
    assert sorted(removed_hashes(cache.take_events())) == sorted(
        stored_hashes(plain + salted + keyed + branch)
    )


def test_wide_token_ids_are_stored_with_sglangs_wide_page_hash():
    cache = make_cache(page_size=2)
    cache.insert([1, 2, 2**32, 7])
    assert stored_hashes(cache.take_events()) == page_hashes([1, 2, 2**32, 7], 2)


@pytest.mark.parametrize("hash_format", ["sglang", "dynamo"])
@pytest.mark.parametrize("namespace", [(None, None), ("k", None), (None, "s"), ("k", "s")])
def test_published_hashes_and_links_follow_the_hash_format(hash_format, namespace):
    cache = make_cache(page_size=2, kv_event_hash_format=hash_format)
    cache.insert(RadixKey([1, 2, 3, 4], *namespace))
    first = cache.take_events()
    cache.insert(RadixKey([1, 2, 3, 4, 5, 6], *namespace))
    second = cache.take_events()
    want = published_page_hashes([1, 2, 3, 4, 5, 6], 2, *namespace, hash_format)
    assert stored_hashes(first) + stored_hashes(second) == want
    assert stored_links(second) == [(want[2], want[1])]


def test_an_unknown_hash_format_is_refused():
    with pytest.raises(ValueError, match="valid: sglang, dynamo"):
        make_cache(kv_event_hash_format="dynamo-v2")


def test_disabled_cache_stores_nothing_and_frees_what_it_is_given():
    cache = RadixCache(capacity=4, disable=True, enable_kv_cache_events=True)
    slots = cache.allocator.alloc(3)
    assert cache.insert([1, 2, 3], slots) == 0
    assert cache.allocator.available_size() == 4
    result = cache.match_prefix([1, 2, 3])
    assert (result.prefix_len, result.last_node) == (0, cache.root)
    assert cache.evict(3) == 0
    assert cache.take_events() == [AllBlocksCleared()]


def test_cache_frees_into_a_shared_allocator():
    pool = TokenToKVPoolAllocator(size=8, page_size=2)
    cache = RadixCache(page_size=2, allocator=pool)
    cache.insert([1, 2, 3, 4])
    assert pool.available_size() == 4
    cache.reset()
    assert pool.available_size() == 8


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs a KV pool"),
        ({"capacity": 4, "allocator": TokenToKVPoolAllocator(size=4)}, "not both"),
        ({"page_size": 2, "allocator": TokenToKVPoolAllocator(size=4)}, "must match"),
        ({"page_size": 0, "capacity": 4}, "page_size must be an integer >= 1"),
    ],
)
def test_bad_configuration_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RadixCache(**kwargs)


# Eviction keeps its candidates in a lazily updated heap; matching bisects for a mismatch.


def lru_order(cache, num_tokens):
    """The nodes ``evict(num_tokens)`` must remove, in order, found by scanning the tree: the
    least recently used unlocked leaf each time; a parent left childless joins the leaves."""
    gone, order, evicted = set(), [], 0
    nodes, stack = [], list(cache.root.children.values())
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())

    def is_leaf(node):
        return not node.lock_ref and all(c in gone for c in node.children.values())

    while evicted < num_tokens:
        leaves = [n for n in nodes if n not in gone and is_leaf(n)]
        if not leaves:
            break
        leaf = min(leaves, key=lambda n: n.last_access_time)
        gone.add(leaf)
        order.append(leaf)
        evicted += len(leaf.key)
    return order


@settings(max_examples=80, deadline=None)
@given(
    page_size=st.sampled_from([1, 2]),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["insert", "insert", "match", "lock", "unlock", "evict"]),
            st.lists(st.integers(0, 2), min_size=1, max_size=8),
        ),
        max_size=40,
    ),
)
def test_evict_takes_leaves_in_lru_order_whatever_happened_before(page_size, ops):
    cache = make_cache(page_size)
    locked = []
    for op, tokens in ops:
        if op == "insert":
            cache.insert(tokens)
        elif op == "match":
            cache.match_prefix(tokens)
        elif op == "lock":
            node = cache.match_prefix(tokens).last_node
            cache.inc_lock_ref(node)
            locked.append(node)
        elif op == "unlock" and locked:
            cache.dec_lock_ref(locked.pop(len(tokens) % len(locked)))
        elif op == "evict":
            n = tokens[0] + len(tokens) // 2 + 1
            expected = lru_order(cache, n)
            cache.take_events()
            assert cache.evict(n) == sum(len(node.key) for node in expected)
            removed = removed_hashes(cache.take_events())
            assert removed == [
                digest_to_int(node.digests[i : i + 32])
                for node in expected
                for i in range(0, len(node.digests), 32)
            ]
        assert len(cache._heap) <= 2 * cache._num_nodes + 65


def tree_state(cache):
    """Every node's tokens, slots, use, hits and parent's tokens, depth-first from the root."""
    state, stack = [], [cache.root]
    while stack:
        node = stack.pop()
        parent = None if node.parent is None else list(node.parent.key)
        state.append((list(node.key), node.value, node.last_access_time, node.hit_count, parent))
        stack.extend(node.children[k] for k in sorted(node.children, key=repr))
    return state


@settings(max_examples=40, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 3]),
    ops=st.lists(
        st.tuples(st.booleans(), st.booleans(), st.lists(st.integers(0, 2), max_size=10)),
        max_size=25,
    ),
)
def test_packed_keys_match_insert_and_publish_as_their_token_lists(page_size, ops):
    # ``packed`` gets each key packed or not as drawn: its tree mixes both kinds of node key,
    # and inserts in a row coalesce their events, packed ids with packed ids or with a list.
    lists, packed = make_cache(page_size), make_cache(page_size)

    def same_events_on_the_wire():
        wire = [encode_batch(EventBatch(0.0, c.take_events())) for c in (packed, lists)]
        assert wire[0] == wire[1]

    for insert, pack, tokens in ops:
        key = array("I", tokens) if pack else tokens
        if insert:
            assert lists.insert(tokens) == packed.insert(key)
            continue
        same_events_on_the_wire()
        by_list = lists.match_prefix(tokens)
        by_array = packed.match_prefix(key)
        assert by_array.device_indices == by_list.device_indices
        assert list(by_array.last_node.key) == by_list.last_node.key
        assert tree_state(packed) == tree_state(lists)
    same_events_on_the_wire()
    assert all(type(n.key) in (list, array) for n in packed._nodes())


def test_evict_order_across_matches_locks_and_splits():
    cache = make_cache()
    cache.insert([1, 2, 3, 4])
    cache.insert([5, 6])
    cache.insert([7, 8])
    node = cache.match_prefix([5, 6]).last_node  # used after [7, 8]
    cache.inc_lock_ref(node)
    cache.match_prefix([1, 2])  # splits off [3, 4] (now used) and uses [1, 2] last
    cache.dec_lock_ref(node)  # [5, 6] is a candidate again, with its last use above
    cache.take_events()
    removed = []
    while cache.evict(1):
        events = cache.take_events()
        assert len(events) == 1
        removed.append(events[0].block_hashes)
    hashes = page_hashes([1, 2, 3, 4], 1)
    assert removed == [
        page_hashes([7, 8], 1),
        page_hashes([5, 6], 1),
        hashes[2:],
        hashes[:2],
    ]


def test_repeated_lock_and_unlock_keep_the_eviction_queue_bounded():
    cache = make_cache()
    cache.insert([1, 2, 3])
    cache.insert([4, 5])
    node = cache.match_prefix([1, 2, 3]).last_node
    for _ in range(1000):
        cache.inc_lock_ref(node)
        cache.dec_lock_ref(node)
    assert len(cache._heap) <= 2 * cache._num_nodes + 65
    assert cache.evict(2) == 2  # [4, 5]: [1, 2, 3] was used after it
    assert cache.match_prefix([1, 2, 3]).prefix_len == 3


@settings(max_examples=60, deadline=None)
@given(
    a=st.lists(st.integers(0, 2), min_size=1, max_size=40),
    b=st.lists(st.integers(0, 2), max_size=40),
    pos=st.integers(0, 5),
    page_size=st.sampled_from([1, 2, 3]),
)
def test_match_len_counts_equal_leading_tokens_in_whole_pages(a, b, pos, page_size):
    key = [9] * pos + b
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert match_len(a, key, pos, page_size) == n - n % page_size


# Eviction policies (SGLang's evict_policy): the order in which unlocked leaves go.


def evicted_first_tokens(cache, n):
    """Evict one leaf at a time; the first token of each evicted node, in order."""
    hashes = {}
    for node in cache._nodes():
        hashes[node.hashes[0]] = node.key[0]
    cache.take_events()
    order = []
    for _ in range(n):
        cache.evict(1)
        order += [hashes[h] for h in removed_hashes(cache.take_events()) if h in hashes]
    return order


def test_lru_evicts_the_least_recently_used_leaf_first():
    cache = make_cache(eviction_policy="lru")
    for t in (1, 2, 3):
        cache.insert([t, t])
    cache.match_prefix([1, 1])
    assert evicted_first_tokens(cache, 3) == [2, 3, 1]


def test_lfu_evicts_the_least_often_hit_leaf_first_then_by_recency():
    cache = make_cache(eviction_policy="lfu")
    for t in (1, 2, 3, 4):
        cache.insert([t, t])
    for _ in range(3):
        cache.match_prefix([1, 1])
    cache.match_prefix([2, 2])
    cache.match_prefix([3, 3])  # 2 and 3 hit once; 3 more recently
    assert evicted_first_tokens(cache, 4) == [4, 2, 3, 1]


def test_fifo_evicts_the_oldest_leaf_first_whatever_its_use():
    cache = make_cache(eviction_policy="fifo")
    for t in (1, 2, 3):
        cache.insert([t, t])
    cache.match_prefix([1, 1])
    cache.match_prefix([2, 2])
    assert evicted_first_tokens(cache, 3) == [1, 2, 3]


def test_priority_evicts_the_lowest_request_priority_first_then_by_recency():
    cache = make_cache(eviction_policy="priority")
    cache.insert([1, 1], priority=5)
    cache.insert([2, 2], priority=0)
    cache.insert([3, 3], priority=5)
    cache.insert([4, 4])  # no priority: 0
    cache.match_prefix([2, 2])  # used after 4: 4 goes first among the priority-0 leaves
    cache.match_prefix([1, 1])
    assert evicted_first_tokens(cache, 4) == [4, 2, 3, 1]


def test_priority_of_a_node_is_the_highest_of_the_requests_that_inserted_it():
    cache = make_cache(eviction_policy="priority")
    cache.insert([1, 1, 2], priority=1)
    cache.insert([1, 1, 3], priority=9)  # splits; the shared [1, 1] now has priority 9
    cache.insert([4, 4], priority=2)
    shared = cache.match_prefix([1, 1]).last_node
    assert shared.priority == 9
    assert evicted_first_tokens(cache, 4) == [2, 4, 3, 1]


def test_an_unknown_eviction_policy_is_rejected():
    with pytest.raises(ValueError, match="unknown eviction_policy 'random'; valid: lru, lfu"):
        RadixCache(capacity=4, eviction_policy="random")


@pytest.mark.parametrize("bad", [2**63, -1])
def test_token_ids_that_cannot_be_hashed_are_rejected_with_events_on(bad):
    cache = make_cache()
    cache.insert([1])
    free = cache.allocator.available_size()
    with pytest.raises(
        ValueError, match=r"token ids must be integers in \[0, 9223372036854775807\]"
    ):
        cache.insert([1, bad])
    # Nothing changed: no slot taken, no node, no event.
    assert (cache.total_size(), cache.allocator.available_size()) == (1, free)
    assert stored_pages(cache.take_events()) == [[1]]


def test_coalesced_events_keep_parents_first_and_one_event_per_chain():
    cache = make_cache(page_size=2)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 3, 4, 5, 6])  # continues the tail: extends it
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8])  # and again (in place)
    cache.insert([9, 9])  # a new root: a new event
    events = cache.take_events()
    assert [(e.block_hashes, e.parent_block_hash) for e in events] == [
        (page_hashes([1, 2, 3, 4, 5, 6, 7, 8], 2), None),
        (page_hashes([9, 9], 2), None),
    ]
    assert events[0].token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    # The nodes' own lists were not grown with the event.
    (first,) = [node for node in cache.root.children.values() if node.key[0] == 1]
    assert (first.key, first.hashes) == ([1, 2, 3, 4], page_hashes([1, 2, 3, 4], 2))
    cache.evict(100)
    (removed,) = cache.take_events()  # consecutive removals merge
    assert sorted(removed.block_hashes) == sorted(stored_hashes(events))
    assert first.hashes == page_hashes([1, 2, 3, 4], 2)


@pytest.mark.parametrize("namespace", [(None, None), (None, "s")])
def test_a_cache_can_publish_vllms_exact_sha256_chain(namespace):
    cache = make_cache(page_size=2, kv_event_hash_format="vllm-sha256")
    cache.insert(RadixKey([1, 2, 3, 4], *namespace))
    cache.insert(RadixKey([1, 2, 3, 4, 5, 6], *namespace))
    events = cache.take_events()
    want = published_page_hashes([1, 2, 3, 4, 5, 6], 2, *namespace, "vllm-sha256")
    assert stored_hashes(events) == want
    assert stored_links(events)[2] == (want[2], want[1])
    assert want == page_hashes(
        [1, 2, 3, 4, 5, 6], 2, cache_salt=namespace[1], hash_format="vllm-sha256"
    )
