"""KvIndex: per-rank block sets built from events, and prefix matching by page hashes."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from schedkit.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KvIndex,
    page_hashes,
)
from schedkit.kv_events.attention_groups import MAX_GROUPS
from schedkit.kv_events.index import DEFAULT_MAX_RANKS, DEFAULT_UNANNOUNCED_PAGES
from schedkit.kv_events.index_decode import decode_for_index
from schedkit.kv_events.structs import decode_batch
from tests.schedkit.kv_events.newest import H1, H2, H3, REMOTE, cleared_payload, hybrid_payloads


def stored(tokens: list[int], page_size: int, cache_salt: str | None = None, medium="GPU"):
    """BlockStored events for every page of ``tokens``, chained as a cache emits them."""
    hashes = page_hashes(tokens, page_size, cache_salt=cache_salt)
    events, parent = [], None
    for i, h in enumerate(hashes):
        page = tokens[i * page_size : (i + 1) * page_size]
        events.append(BlockStored([h], parent, page, page_size, None, medium))
        parent = h
    return events


def at(rank: int | None, *events) -> KVEventBatch:
    return KVEventBatch(ts=0.0, events=list(events), attn_dp_rank=rank)


def test_stored_blocks_match_leading_pages_per_rank():
    index = KvIndex()
    index.apply(at(0, *stored([1, 2, 3, 4, 5, 6], 2)))
    index.apply(at(1, *stored([1, 2, 3, 4], 2)))
    index.apply(at(2, *stored([9, 9], 2)))

    assert index.ranks() == [0, 1, 2]
    assert index.match([1, 2, 3, 4, 5, 6, 7], 2) == {0: 3, 1: 2, 2: 0}
    assert index.match([1, 2, 3, 9], 2) == {0: 1, 1: 1, 2: 0}
    assert index.match([9, 9, 1, 2], 2) == {0: 0, 1: 0, 2: 1}
    assert index.match([1], 2) == {0: 0, 1: 0, 2: 0}  # no full page
    assert index.blocks(1) == set(page_hashes([1, 2, 3, 4], 2))


def test_match_stops_at_the_first_missing_page():
    index = KvIndex()
    hashes = page_hashes([1, 2, 3], 1)
    index.apply(at(0, *stored([1, 2, 3], 1)))
    index.apply(at(0, BlockRemoved([hashes[1]], "GPU")))
    assert index.match([1, 2, 3], 1) == {0: 1}  # page 3 is held but page 2 is not


def test_block_removed_only_affects_its_rank():
    index = KvIndex()
    index.apply(at(0, *stored([1, 2, 3, 4], 2)))
    index.apply(at(1, *stored([1, 2, 3, 4], 2)))
    first, second = page_hashes([1, 2, 3, 4], 2)

    index.apply(at(1, BlockRemoved([second], "GPU")))
    assert index.match([1, 2, 3, 4], 2) == {0: 2, 1: 1}
    assert index.owners(second) == {0: "GPU"}
    assert index.owners(first) == {0: "GPU", 1: "GPU"}
    assert index.blocks(0) == {first, second}
    assert index.holds(0, second) and not index.holds(1, second) and not index.holds(7, first)
    assert set(index.holders(first)) == {0, 1} and set(index.holders(second)) == {0}
    assert not index.holders(12345)
    assert index.held(0) == {first, second} and not index.held(7)
    assert index.match_hashes([first, second], [1, 0, 7]) == {1: 1, 0: 2, 7: 0}


def test_all_blocks_cleared_and_clear_rank_clear_one_rank():
    index = KvIndex()
    index.apply(at(0, *stored([1, 2], 1)))
    index.apply(at(1, *stored([1, 2], 1)))
    index.apply(at(2, *stored([1, 2], 1)))

    index.apply(at(0, AllBlocksCleared()))
    index.clear_rank(2)
    assert index.blocks(0) == set() and index.blocks(2) == set()
    assert index.match([1, 2], 1) == {0: 0, 1: 2, 2: 0}
    assert len(index) == 2  # the two hashes rank 1 still holds

    index.clear_rank(1)
    assert len(index) == 0
    index.clear_rank(7)  # an unknown rank is fine


def test_rank_defaults_to_the_batch_rank_then_zero_and_can_be_overridden():
    index = KvIndex()
    index.apply(at(None, *stored([1], 1)))
    index.apply(at(3, *stored([2], 1)))
    index.apply(at(3, *stored([3], 1)), rank=5)
    assert index.blocks(0) == set(page_hashes([1], 1))
    assert index.blocks(3) == set(page_hashes([2], 1))
    assert index.blocks(5) == set(page_hashes([3], 1))


def test_ranks_named_by_batches_are_bounded_and_the_refusal_is_counted_and_logged():
    index = KvIndex(max_ranks=3)
    index.apply(at(None, *stored([1], 1)))
    index.apply(at(3, *stored([2], 1)))
    with capture_logs() as logs:
        for rank in range(100, 10_100):  # a publisher naming a new rank in every batch
            index.apply(at(rank, *stored([rank], 1)))
    assert index.ranks() == [0, 3, 100] and index.bad_input["rank"] == 9_999
    assert [entry["rank"] for entry in logs] == [101]  # the first refusal, once
    assert logs[0]["event"] == "kv_events.index_refused" and "apply(batch, rank)" in logs[0]["fix"]
    index.apply(at(3, *stored([4], 1)))  # a known rank still applies
    index.apply(at(7, *stored([5], 1)), rank=5)  # a rank the caller names is the caller's
    assert index.blocks(3) == set(page_hashes([2], 1) + page_hashes([4], 1))
    assert index.ranks() == [0, 3, 5, 100] and index.bad_input.total == 9_999
    assert KvIndex().max_ranks == DEFAULT_MAX_RANKS == 64
    with pytest.raises(ValueError, match="max_ranks"):
        KvIndex(max_ranks=0)


def test_namespace_and_medium():
    index = KvIndex()
    index.apply(at(0, *stored([1, 2], 1, cache_salt="tenant-a", medium="CPU_PINNED")))
    assert index.match([1, 2], 1) == {0: 0}
    assert index.match([1, 2], 1, extra_key="tenant-a") == {0: 0}
    assert index.match([1, 2], 1, cache_salt="tenant-a") == {0: 2}
    assert index.owners(page_hashes([1], 1, cache_salt="tenant-a")[0]) == {0: "CPU_PINNED"}


def test_coalesced_events_match_like_single_pages():
    hashes = page_hashes([1, 2, 3, 4, 5, 6], 2)
    index = KvIndex()
    index.apply(at(0, BlockStored(hashes, None, [1, 2, 3, 4, 5, 6], 2, None, "GPU")))
    assert index.match([1, 2, 3, 4, 5, 6], 2) == {0: 3}
    index.apply(at(0, BlockRemoved(hashes[1:], "GPU")))
    assert index.match([1, 2, 3, 4, 5, 6], 2) == {0: 1}


def test_unknown_event_is_rejected():
    with pytest.raises(TypeError, match="unknown KV event"):
        KvIndex().apply(KVEventBatch(ts=0.0, events=["nope"]))


def test_match_hashes_in_the_stream_hash_format():
    tokens = [1, 2, 3, 4]
    dynamo = page_hashes(tokens, 2, extra_key="k", cache_salt="s", hash_format="dynamo")
    index = KvIndex()
    index.apply(at(0, BlockStored(dynamo, None, tokens, 2, None, "GPU", "s")))
    assert index.match(tokens, 2, extra_key="k", cache_salt="s") == {0: 0}
    assert index.match(tokens, 2, extra_key="k", cache_salt="s", hash_format="dynamo") == {0: 2}


def test_a_rank_never_holds_more_than_its_pool():
    index = KvIndex(violation_threshold=100)
    index.set_capacity(0, 4)
    index.apply(at(0, BlockStored(list(range(10)), None, [], 1, None)))
    assert index.num_blocks(0) == 4 and index.blocks(0) == {0, 1, 2, 3}
    assert index.violations(0) == 6 and not index.violating(0)
    assert index.owners(3) == {0: None} and index.owners(4) == {}  # a page not kept has no owner
    exact = KvIndex()
    exact.set_capacity(0, 4)
    exact.apply(at(0, BlockStored([0, 1, 2, 3], None, [], 1, None)))  # fills it exactly
    assert exact.blocks(0) == {0, 1, 2, 3} and exact.violations(0) == 0
    # Pages it holds already may be stored again; freed room may be used.
    index.apply(at(0, BlockStored([3], None, [], 1, None), BlockRemoved([0, 1])))
    index.apply(at(0, BlockStored([20, 21, 22], None, [], 1, None)))
    assert index.blocks(0) == {2, 3, 20, 21} and index.violations(0) == 7
    index.apply(at(0, BlockStored(list(range(100, 200)), None, [], 1, None)))
    assert index.violating(0) and index.num_blocks(0) == 4
    assert index.violations(1) == 0 and index.capacity(1) == index.unannounced_pages


def test_a_rank_that_never_announces_its_pool_is_indexed_up_to_a_small_default():
    index = KvIndex(unannounced_pages=8, violation_threshold=4)
    assert not index.announced(0) and index.capacity(0) == 8
    index.apply(at(0, BlockStored(list(range(20)), None, [], 1, None)))
    # Not kept, but no promise broken: counted apart, and the rank is not untrusted.
    assert index.num_blocks(0) == 8 and index.unindexed(0) == 12
    assert index.violations(0) == 0 and not index.violating(0)
    # Once it announces, its pool is the bound and storing past it is a violation.
    index.set_capacity(0, 10)
    assert index.announced(0)
    index.apply(at(0, BlockStored(list(range(20, 30)), None, [], 1, None)))
    assert index.num_blocks(0) == 10 and index.violations(0) == 8 and index.violating(0)
    # The default: 65,536 pages (~4 MiB of index), below the most a rank may announce.
    assert KvIndex().capacity(0) == DEFAULT_UNANNOUNCED_PAGES == 1 << 16
    assert KvIndex(max_pages=100).capacity(0) == 100


def test_an_announced_pool_is_clamped_to_the_bound():
    index = KvIndex(max_pages=1000)
    index.set_capacity(0, 10**18)
    index.set_capacity(1, -5)
    assert (index.capacity(0), index.capacity(1)) == (1000, 1)


def test_medium_names_past_the_bounds_are_kept_as_none_and_counted():
    index = KvIndex()
    index.apply(at(0, BlockStored([1], None, [], 1, None, "x" * 33)))
    assert index.owners(1) == {0: None} and index.violations(0) == 1
    for i in range(20):
        index.apply(at(0, BlockStored([100 + i], None, [], 1, None, f"tier{i}")))
    assert index.owners(100) == {0: "tier0"} and index.owners(119) == {0: None}
    assert index.violations(0) == 1 + 4  # 16 distinct names are kept


def test_an_index_per_medium_follows_only_its_medium():
    tokens = list(range(8))
    gpu, cpu = KvIndex(medium="GPU"), KvIndex(medium="CPU_PINNED")
    hashes = page_hashes(tokens, 4)
    batch = at(
        0,
        *stored(tokens, 4),
        *stored(tokens, 4, medium="CPU_PINNED"),
        BlockRemoved(hashes[1:], "GPU"),
    )
    for index in (gpu, cpu):
        index.apply(batch)
    assert gpu.match(tokens, 4) == {0: 1} and cpu.match(tokens, 4) == {0: 2}
    assert cpu.owners(hashes[1]) == {0: "CPU_PINNED"}
    cpu.apply(at(0, AllBlocksCleared()))
    assert cpu.num_blocks(0) == 0
    with pytest.raises(TypeError, match="unknown KV event"):
        gpu.apply(KVEventBatch(ts=0.0, events=["nope"]))


def test_a_page_keeps_the_medium_it_was_last_stored_in():
    index = KvIndex()
    index.apply(at(0, BlockStored([1, 2], None, [], 1, None, "GPU")))
    index.apply(at(0, BlockStored([2, 3], 1, [], 1, None, "CPU_PINNED")))
    index.apply(at(1, BlockStored([2], None, [], 1, None, None)))
    assert [index.owners(h) for h in (1, 2, 3)] == [
        {0: "GPU"},
        {0: "CPU_PINNED", 1: None},
        {0: "CPU_PINNED"},
    ]
    index.apply(at(0, BlockStored([2], 1, [], 1, None, "GPU"), BlockRemoved([3])))
    assert index.owners(2) == {0: "GPU", 1: None} and index.owners(3) == {}
    index.apply(at(0, BlockStored([3], 2, [], 1, None, "CPU_PINNED"), AllBlocksCleared()))
    index.apply(at(0, BlockStored([3], None, [], 1, None, "GPU")))
    assert index.owners(3) == {0: "GPU"} and index.blocks(0) == {3}


@pytest.mark.parametrize("decode", [decode_batch, decode_for_index])
def test_a_hybrid_models_index_follows_its_main_attention_group(decode):
    gpu, every_medium = KvIndex(medium="GPU"), KvIndex()
    for payload in hybrid_payloads(rank=1):
        gpu.apply(decode(payload))
        every_medium.apply(decode(payload))
    # The sliding-window group let H1 and H2 go and the remote page never was this rank's.
    assert gpu.held(1) == {H1, H2, H3} == every_medium.held(1)
    assert gpu.match_hashes([H1, H2, H3, REMOTE]) == {1: 3}
    assert every_medium.owners(H1) == {1: "CPU"}  # the offload tier stored it last
    every_medium.apply(decode_batch(cleared_payload(rank=1)))
    assert every_medium.num_blocks(1) == 0


def test_groups_are_followed_by_their_learned_kind():
    def event(kind=BlockStored, group=None, attention=None, locality=None, h=1):
        if kind is BlockRemoved:
            return BlockRemoved([h], "GPU", group, locality)
        fields = {"group_idx": group, "kv_cache_spec_kind": attention, "locality": locality}
        return BlockStored([h], None, [h], 1, None, "GPU", **fields)

    index = KvIndex()
    index.apply(at(0, event(group=0), event(group=2, h=2), event(group=3, attention="mamba", h=3)))
    assert index.blocks(0) == {1}  # group 0 is main until told; 2 is not known; 3 is Mamba
    index.apply(at(0, event(group=2, attention="mla_attention", h=2), event(BlockRemoved, 3, h=2)))
    assert index.blocks(0) == {1, 2}  # the removal of group 3 (Mamba) is not group 2's
    index.apply(at(0, event(group=0, attention="sliding_window", h=4), event(BlockRemoved, 0)))
    assert index.blocks(0) == {1, 2}  # group 0 is now known to be a sliding window
    index.apply(at(0, event(BlockRemoved, 2, h=2), event(BlockRemoved, None, h=1)))
    assert index.blocks(0) == set()
    index.apply(at(1, event(group=0, h=5), event(group=0, locality="LOCAL", h=6)))
    index.apply(at(1, event(locality="REMOTE", h=7), event(locality="elsewhere", h=8)))
    index.apply(at(1, event(BlockRemoved, locality="REMOTE", h=5)))
    assert index.blocks(1) == {5, 6}  # rank 1 learned nothing of rank 0's groups


def test_the_kinds_learned_per_rank_are_bounded():
    index = KvIndex()
    for group in range(MAX_GROUPS + 10):  # past the bound a group stays unknown
        kind = "sliding_window" if group % 2 else "full_attention"
        fields = {"group_idx": group, "kv_cache_spec_kind": kind}
        index.apply(at(0, BlockStored([group], None, [0], 1, None, None, **fields)))
    removals = [BlockRemoved([g], None, g) for g in range(MAX_GROUPS + 10)]
    index.apply(at(0, *removals))
    # Learned main groups lose their pages; unknown groups (past the bound) keep theirs.
    assert index.blocks(0) == set(range(MAX_GROUPS, MAX_GROUPS + 10, 2))
