"""SGLang's calling conventions on the three prefix caches: construction from CacheInitParams
and create_simulated, the parameter / result objects beside the positional calls, and
TreeNode's SGLang defaults."""

from __future__ import annotations

import hashlib
import struct
from array import array

import pytest

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.hiradix_cache import HiRadixCache
from schedkit.components.cache.radix_cache import (
    CacheInitParams,
    EvictParams,
    EvictResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    RadixCache,
    RadixKey,
    TreeNode,
)
from schedkit.components.cache.sglang_api import SIMULATED_SIZE, SimulatedSlots
from schedkit.components.cache.swa_radix_cache import SWARadixCache
from schedkit.kv_events.structs import BlockRemoved, BlockStored

CACHES = {
    "radix": (RadixCache, {}),
    "swa": (SWARadixCache, {"sliding_window_size": 4}),
    "hiradix": (HiRadixCache, {}),
}


@pytest.fixture(params=sorted(CACHES))
def cache_kind(request):
    return CACHES[request.param]


class RecordingAllocator:
    """A stand-in pool (SGLang's tests pass a mock): records what the cache frees."""

    device = "cpu"

    def __init__(self) -> None:
        self.freed: list[list[int]] = []
        self.size = 64

    def free(self, slots) -> None:
        self.freed.append(list(slots))


def test_create_simulated_gives_a_cache_of_labels(cache_kind):
    cls, extra = cache_kind
    for page_size, disable, events in [(1, False, False), (4, False, True), (1, True, False)]:
        cache = cls.create_simulated(
            disable=disable, page_size=page_size, enable_kv_cache_events=events, **extra
        )
        assert type(cache) is cls
        assert (cache.page_size, cache.disable, cache.enable_kv_cache_events) == (
            page_size,
            disable,
            events,
        )
        assert cache.root_node is cache.root and len(cache.root_node.key) == 0
        assert isinstance(cache.allocator, SimulatedSlots)
        assert isinstance(getattr(cache, "swa_allocator", SimulatedSlots()), SimulatedSlots)
        assert (cache.kv_events is not None) == events
    # Caller labels go in as they are; reset and evict hand them back without a pool to check.
    cache = cls.create_simulated(**extra)
    assert cache.insert(RadixKey([1, 2, 3]), [10, 20, 30]) == 0
    assert cache.match_prefix(RadixKey([1, 2, 3])).device_indices == [10, 20, 30]
    assert cache.evict(3) in (3, (3, 3))  # the SWA cache counts both pools
    cache.insert([4, 5], [40, 50])
    cache.reset()
    assert cache.total_size() == 0 and cache.evictable_size() == cache.protected_size() == 0
    # Without a value the cache takes fresh labels, above the ones a caller picks.
    cache.insert([7, 8])
    assert min(cache.match_prefix([7, 8]).device_indices) >= SIMULATED_SIZE


def test_create_simulated_with_an_allocator_or_a_capacity(cache_kind):
    cls, extra = cache_kind
    pool = RecordingAllocator()
    if cls is RadixCache:  # the pool a mock stands for: one the cache only frees into
        cache = cls.create_simulated(mock_allocator=pool, enable_kv_cache_events=True)
        cache.insert(RadixKey([1, 2]), [10, 20])
        cache.insert(RadixKey([3, 4]), [30, 40])
        assert cache.evict(2) == 2
        assert pool.freed == [[10, 20]] and cache.total_size() == 2
        kinds = [type(e) for e in cache.take_events()]
        assert BlockStored in kinds and BlockRemoved in kinds
    cache = cls.create_simulated(capacity=16, **extra)
    assert isinstance(cache.allocator, TokenToKVPoolAllocator) and cache.allocator.size == 16
    cache.insert([1, 2, 3])
    assert cache.allocator.available_size() == 13


def test_cache_init_params_build_the_cache(cache_kind):
    cls, extra = cache_kind
    pool = TokenToKVPoolAllocator(size=32, page_size=2)
    window = extra.get("sliding_window_size")
    params = CacheInitParams(
        False, None, pool, 2, eviction_policy="LFU", enable_kv_cache_events=True
    )
    params.sliding_window_size = window
    for cache in (cls(params), cls(params=params), cls(params, disable=True)):
        assert cache.allocator is pool and cache.page_size == 2
        assert cache.eviction_policy == "lfu" and cache.enable_kv_cache_events
        pool.clear()
    assert cls(params, disable=True).disable
    # A cache without SGLang's allocator: simulated, or a real pool when a capacity is given.
    unpooled = CacheInitParams(False, None, None, 1, sliding_window_size=window)
    assert isinstance(cls(unpooled).allocator, SimulatedSlots)
    assert cls(unpooled, capacity=8).allocator.size == 8
    if cls is SWARadixCache:
        assert cls(params).sliding_window_size == 4
        eagle = CacheInitParams(False, None, None, 1, is_eagle=True, sliding_window_size=4)
        assert cls(eagle).is_eagle
    else:  # SGLang's other caches ignore the window; EAGLE keys are the SWA cache's only
        params.sliding_window_size = 8
        assert not hasattr(cls(params), "sliding_window_size")
        with pytest.raises(ValueError, match="has no EAGLE bigram keys"):
            cls(CacheInitParams(False, None, None, 1, is_eagle=True))
    with pytest.raises(TypeError, match="takes a CacheInitParams"):
        cls({"page_size": 1})


def test_params_and_positional_forms_agree(cache_kind):
    cls, extra = cache_kind
    cache = cls.create_simulated(page_size=2, enable_kv_cache_events=True, **extra)
    # Values as anything with tolist() (an array here; a tensor in SGLang's tests) or ints.
    inserted = cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 5]), value=array("q", range(5))))
    assert inserted == InsertResult(prefix_len=0)
    assert cache.insert(InsertParams(RadixKey([1, 2, 3, 4]), (0, 1, 2, 3), 5)).prefix_len == 4
    assert cache.insert(RadixKey([1, 2, 7, 8]), [0, 1, 12, 13]) == 2
    assert cache.total_size() == 6
    by_params = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4, 9, 9])))
    by_key = cache.match_prefix(RadixKey([1, 2, 3, 4, 9, 9]))
    assert by_params.device_indices == by_key.device_indices == [0, 1, 2, 3]
    assert by_params.last_device_node is by_params.last_node is by_key.last_node
    assert by_params.last_host_node is by_params.best_match_node is by_params.last_node
    assert by_params.last_node.priority == 5  # InsertParams.priority reached the path
    node = by_params.last_device_node
    cache.inc_lock_ref(node)
    assert (cache.protected_size(), cache.evictable_size()) == (4, 2)
    cache.dec_lock_ref(node)
    assert (cache.protected_size(), cache.total_size()) == (0, 6)
    assert cache.take_events() and cache.take_events() == []
    empty = cls.create_simulated(disable=True, **extra)
    assert empty.insert(InsertParams(key=RadixKey([1, 2]), value=[1, 2])) == InsertResult(0)
    assert empty.match_prefix(MatchPrefixParams(RadixKey([1, 2]))).device_indices == []


def test_evict_params_give_an_evict_result(cache_kind):
    cls, extra = cache_kind
    cache = cls.create_simulated(**extra)
    cache.insert([1, 2], [10, 20])
    cache.insert([3, 4], [30, 40])
    result = cache.evict(EvictParams(num_tokens=2))
    assert isinstance(result, EvictResult) and result.num_tokens_evicted == 2
    assert cache.total_size() == 2
    assert cache.evict(EvictParams()) == EvictResult()
    if cls is SWARadixCache:  # an unlocked leaf's window goes with the leaf (never matchable)
        assert cache.evict(EvictParams(swa_num_tokens=2)) == EvictResult(2, 2)
        assert cache.total_size() == 0 and cache.swa_evictable_size() == 0
    else:
        assert cache.evict(EvictParams(swa_num_tokens=2)).swa_num_tokens_evicted == 0


def test_hiradix_match_result_names_the_host_node():
    cache = HiRadixCache.create_simulated(capacity=8, load_back_threshold=0)
    cache.insert(RadixKey([1, 2, 3, 4]), cache.allocator.alloc(4))
    assert cache.evict(EvictParams(num_tokens=4)).num_tokens_evicted == 4
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4])))
    assert match.device_indices == [] and match.last_device_node is cache.root_node
    assert match.host_hit_length == 4 and match.last_host_node.key == [1, 2, 3, 4]
    assert match.best_match_node is match.last_host_node and match.last_host_node.backuped
    assert match.last_host_node.evicted


def test_parameter_objects_refuse_fields_not_modelled():
    with pytest.raises(TypeError, match="chunked"):
        InsertParams(key=RadixKey([1]), chunked=True)
    with pytest.raises(TypeError, match="mamba_num"):
        EvictParams(num_tokens=1, mamba_num=1)
    with pytest.raises(TypeError, match="enable_metrics"):
        CacheInitParams(False, None, None, 1, enable_metrics=True)


def test_tree_node_has_sglang_defaults():
    TreeNode.counter = 0
    node = TreeNode()
    assert node.id == 0 and node.parent is None and len(node.children) == 0
    assert node.key is None and node.value is None and node.host_value is None
    assert node.lock_ref == node.hit_count == node.host_ref_counter == 0
    assert node.hash_value is None and node.get_last_hash_value() is None
    assert TreeNode(id=42).id == 42 and TreeNode().id == 2  # the counter moves on regardless
    later = TreeNode()
    assert node < later and not later < node
    assert node.evicted and not node.backuped
    node.value, node.host_value = [1], [2]
    assert not node.evicted and node.backuped
    node.protect_host()
    assert node.host_ref_counter == 1
    node.release_host()
    with pytest.raises(RuntimeError, match="not protected"):
        node.release_host()
    assert repr(TreeNode()) == "TreeNode(key=None)"


def _sglang_page_hash(tokens: list[int], prior: str | None) -> str:
    """SGLang's ``get_hash_str``: SHA-256 over the prior page's digest and the page's token ids
    as 4-byte little-endian integers, as hex."""
    data = (bytes.fromhex(prior) if prior else b"") + struct.pack(f"<{len(tokens)}I", *tokens)
    return hashlib.sha256(data).hexdigest()


def test_hash_value_is_sglangs_page_chain(cache_kind):
    cls, extra = cache_kind
    cache = cls.create_simulated(page_size=2, enable_kv_cache_events=True, **extra)
    cache.insert(RadixKey([1, 2, 3, 4]), [0, 1, 2, 3])
    cache.insert(RadixKey([1, 2, 5, 6]), [0, 1, 4, 5])  # splits the first node after a page
    upper = cache.root_node.children[(1, 2)]
    first = _sglang_page_hash([1, 2], None)
    assert upper.hash_value == [first] and upper.get_last_hash_value() == first
    lower = upper.children[(3, 4)]
    assert lower.hash_value == [_sglang_page_hash([3, 4], first)]
    assert cache.root_node.hash_value == []
    # Setting it takes SHA-256 digests, as the node's chain is made of them.
    upper.hash_value = [lower.hash_value[0]]
    assert upper.get_last_hash_value() == lower.hash_value[0]
    with pytest.raises(ValueError, match="64 hex digits"):
        upper.hash_value = ["hash1"]
    upper.hash_value = None
    assert upper.get_last_hash_value() is None


def test_simulated_slots_count_and_never_run_short():
    slots = SimulatedSlots(size=8, page_size=2)
    assert slots.alloc(4) == [8, 9, 10, 11] and slots.alloc(2) == [12, 13]
    assert slots.available_size() == 8
    slots.free([8, 9, 3])
    assert slots.freed == 3
    slots.clear()
    assert slots.freed == 0
    with pytest.raises(ValueError, match="multiple of page_size=2"):
        slots.alloc(3)
