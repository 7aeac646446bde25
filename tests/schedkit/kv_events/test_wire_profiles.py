"""Golden tests: what we encode decodes with the engines' own struct declarations, and back.

The engines' structs are declared independently in ``engine_structs``, as SGLang and vLLM
declare them, so that a change to schedkit's structs that breaks the wire shows up as a
failure here.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedkit.kv_events import event_structs as ours
from schedkit.kv_events.index_decode import decode_for_index
from schedkit.kv_events.wire_profiles import PROFILES, decode_batch, encode_batch, get_profile
from schedkit.kv_events.wire_shape import shape_problems
from tests.schedkit.kv_events.engine_structs import (
    AllBlocksCleared,
    ArrayAllBlocksCleared,
    ArrayBatch,
    ArrayBlockRemoved,
    ArrayBlockStored,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    VllmAllBlocksCleared,
    VllmBatch,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmMainBatch,
    VllmMainBlockRemoved,
    VllmNewestAllBlocksCleared,
    VllmNewestBatch,
    VllmNewestBlockRemoved,
    VllmNewestBlockStored,
)
from tests.schedkit.kv_events.newest import H1, H2, H3, REMOTE, bytes_hash_payload, hybrid_payloads

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


STORED = [
    ([INT64_MIN, INT64_MAX], None, [1, 2, 3, 4], 2, None, "GPU"),
    ([-7], INT64_MAX, [5, 6], 2, 3, "CPU_PINNED"),
    ([11], -7, [7, 8], 2, None, None),
]
REMOVED = [([INT64_MIN], "GPU"), ([11], None)]


def golden_batch(stored, removed, cleared, batch, extra=()):
    """The same six events, built from one family of struct classes (all positional);
    ``extra`` is appended to every BlockStored's fields (vLLM's lora_name)."""
    return batch(
        1700000000.25,
        [
            *(stored(*fields, *extra) for fields in STORED),
            *(removed(*fields) for fields in REMOVED),
            cleared(),
        ],
        3,
    )


def our_batch() -> ours.KVEventBatch:
    return golden_batch(
        ours.BlockStored, ours.BlockRemoved, ours.AllBlocksCleared, ours.KVEventBatch
    )


def sglang_batch() -> KVEventBatch:
    return golden_batch(BlockStored, BlockRemoved, AllBlocksCleared, KVEventBatch)


def array_batch() -> ArrayBatch:
    return golden_batch(ArrayBlockStored, ArrayBlockRemoved, ArrayAllBlocksCleared, ArrayBatch)


def vllm_batch() -> VllmBatch:
    return golden_batch(
        VllmBlockStored, VllmBlockRemoved, VllmAllBlocksCleared, VllmBatch, extra=(None,)
    )


def as_builtins(obj) -> object:
    return msgspec.to_builtins(obj)


def test_sglang_profile_is_byte_identical_to_sglang_structs():
    assert encode_batch(our_batch(), "sglang") == msgspec.msgpack.encode(sglang_batch())


def test_sglang_structs_decode_what_we_send():
    decoded = msgspec.msgpack.Decoder(KVEventBatch).decode(encode_batch(our_batch(), "sglang"))
    assert decoded == sglang_batch()


def test_we_decode_what_sglang_sends():
    batch = sglang_batch()
    batch.events[0].cache_salt = "tenant-a"
    batch.events[0].lora_name = "adapter-a"
    ours_ = our_batch()
    ours_.events[0].cache_salt = "tenant-a"
    ours_.events[0].lora_name = "adapter-a"
    assert decode_batch(msgspec.msgpack.encode(batch)) == ours_


def test_sglang_wire_shape():
    raw = msgspec.msgpack.decode(encode_batch(our_batch(), "sglang"))
    assert raw[0] == 1700000000.25
    assert raw[2] == 3
    assert raw[1][0] == {
        "type": "BlockStored",
        "block_hashes": [INT64_MIN, INT64_MAX],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
    }
    assert "medium" not in raw[1][2]
    assert raw[1][3] == {"type": "BlockRemoved", "block_hashes": [INT64_MIN], "medium": "GPU"}
    assert raw[1][4] == {"type": "BlockRemoved", "block_hashes": [11]}
    assert raw[1][5] == {"type": "AllBlocksCleared"}


def test_sglang_batch_without_rank_still_has_three_elements():
    raw = msgspec.msgpack.decode(encode_batch(ours.KVEventBatch(1.0, []), "sglang"))
    assert raw == [1.0, [], None]


def test_namespaced_fields_reach_sglang():
    event = ours.BlockStored([5], None, [1, 2], 2, None, "GPU", cache_salt="s", session_id="c")
    payload = encode_batch(ours.KVEventBatch(1.0, [event], 0), "sglang")
    decoded = msgspec.msgpack.Decoder(KVEventBatch).decode(payload).events[0]
    assert (decoded.cache_salt, decoded.session_id, decoded.lora_name) == ("s", "c", None)


def test_array_profile_is_byte_identical_to_older_sglang_structs():
    assert encode_batch(our_batch(), "sglang-array") == msgspec.msgpack.encode(array_batch())


def test_array_profile_wire_shape():
    raw = msgspec.msgpack.decode(encode_batch(our_batch(), "sglang-array"))
    assert raw[1][0] == ["BlockStored", [INT64_MIN, INT64_MAX], None, [1, 2, 3, 4], 2, None, "GPU"]
    assert raw[1][3] == ["BlockRemoved", [INT64_MIN], "GPU"]
    assert raw[1][5] == ["AllBlocksCleared"]


def test_we_decode_what_older_sglang_sends():
    assert decode_batch(msgspec.msgpack.encode(array_batch())) == our_batch()


def test_vllm_structs_decode_what_we_send():
    payload = encode_batch(our_batch(), "vllm")
    assert msgspec.msgpack.Decoder(VllmBatch).decode(payload) == vllm_batch()


def test_we_decode_what_vllm_sends():
    batch = vllm_batch()
    batch.events[0].lora_name = "adapter-a"
    expected = our_batch()
    expected.events[0].lora_name = "adapter-a"
    assert decode_batch(msgspec.msgpack.encode(batch)) == expected


@pytest.mark.parametrize(
    ("removed", "batch"),
    [(VllmNewestBlockRemoved, VllmNewestBatch), (VllmMainBlockRemoved, VllmMainBatch)],
    ids=["vllm-0.33.0", "vllm-main"],
)
def test_the_newest_vllm_structs_decode_what_we_send(removed, batch):
    payload = encode_batch(our_batch(), "vllm")
    expected = golden_batch(
        VllmNewestBlockStored, removed, VllmNewestAllBlocksCleared, batch, extra=(None,)
    )
    assert msgspec.msgpack.Decoder(batch).decode(payload) == expected


def test_we_decode_what_the_newest_vllm_sends_with_every_field():
    batches = [decode_batch(payload) for payload in hybrid_payloads(rank=2)]
    assert [b.attn_dp_rank for b in batches] == [2, 2, 2, 2]
    first, swa = batches[0].events
    assert (first.block_hashes, first.group_idx, first.kv_cache_spec_kind) == (
        [H1, H2],
        0,
        "full_attention",
    )
    assert (swa.group_idx, swa.kv_cache_spec_kind, swa.locality) == (1, "sliding_window", "LOCAL")
    assert (first.lora_id, first.lora_name, first.session_id) == (1, "sql-lora", "chat-7")
    assert first.token_ids == [7] * 8 and first.medium == "GPU"
    removed, third = batches[1].events
    assert (removed.block_hashes, removed.group_idx, third.parent_block_hash) == ([H1], 1, H2)
    assert batches[2].events[1].locality == "REMOTE" and batches[2].events[0].medium == "CPU"
    assert batches[3].events[1].block_hashes == [REMOTE] and H3 in batches[1].events[1].block_hashes
    for payload, batch in zip(hybrid_payloads(rank=2), batches, strict=True):
        assert get_profile("vllm").strict_decode(payload) == batch
        problems = shape_problems(payload)
        assert problems["vllm"] is None, problems
        assert problems["sglang"] is not None and problems["sglang-array"] is not None


@pytest.mark.parametrize("parent_only", [False, True])
def test_bytes_block_hashes_are_refused_saying_what_to_do(parent_only):
    payload = bytes_hash_payload(parent_only=parent_only)
    where = "parent_block_hash" if parent_only else "block_hashes[0]"
    decoders = [decode_batch, decode_for_index]
    decoders += [get_profile(name).strict_decode for name in PROFILES if name != "sglang-array"]
    for decode in decoders:
        with pytest.raises(msgspec.ValidationError) as refused:
            decode(payload)
        assert str(refused.value).startswith(f"block hashes are bytes at `$[1][0].{where}`")
        assert "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1" in str(refused.value)
    assert "block hashes are bytes" in shape_problems(payload)["vllm"]


def test_vllm_wire_shape():
    raw = msgspec.msgpack.decode(encode_batch(our_batch(), "vllm"))
    assert isinstance(raw, list)
    assert raw[0] == 1700000000.25
    assert raw[2] == 3
    assert raw[1][0] == {
        "type": "BlockStored",
        "block_hashes": [INT64_MIN, INT64_MAX],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    assert raw[1][4] == {"type": "BlockRemoved", "block_hashes": [11], "medium": None}
    assert raw[1][5] == {"type": "AllBlocksCleared"}


def test_each_engine_rejects_the_other_layouts():
    # What a consumer built for one layout makes of another: the reason profiles exist.
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.Decoder(KVEventBatch).decode(encode_batch(our_batch(), "sglang-array"))
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.Decoder(ArrayBatch).decode(encode_batch(our_batch(), "sglang"))
    with pytest.raises(msgspec.ValidationError, match="lora_name"):
        msgspec.msgpack.Decoder(VllmBatch).decode(encode_batch(our_batch(), "sglang"))


hashes = st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=1, max_size=3)
tokens = st.lists(st.integers(0, 2**32 - 1), max_size=6)
medium = st.sampled_from([None, "GPU", "CPU", "CPU_PINNED", "DISK", "EXTERNAL"])
events = st.one_of(
    st.builds(
        ours.BlockStored,
        hashes,
        st.none() | st.integers(INT64_MIN, INT64_MAX),
        tokens,
        st.integers(1, 64),
        st.none() | st.integers(0, 100),
        medium,
        cache_salt=st.none() | st.text(max_size=4),
        session_id=st.none() | st.text(max_size=4),
        lora_name=st.none() | st.text(max_size=4),
    ),
    st.builds(ours.BlockRemoved, hashes, medium),
    st.builds(ours.AllBlocksCleared),
)
batches = st.builds(
    ours.KVEventBatch,
    st.floats(0, 2e9, allow_nan=False),
    st.lists(events, max_size=5),
    st.none() | st.integers(0, 63),
)


@settings(max_examples=60, deadline=None)
@given(batch=batches)
def test_every_profile_agrees_with_engine_structs(batch):
    sglang = msgspec.msgpack.Decoder(KVEventBatch).decode(encode_batch(batch, "sglang"))
    assert as_builtins(sglang) == as_builtins(batch)
    assert decode_batch(msgspec.msgpack.encode(sglang)) == batch
    vllm = msgspec.msgpack.Decoder(VllmBatch).decode(encode_batch(batch, "vllm"))
    assert vllm.ts == batch.ts and vllm.data_parallel_rank == batch.attn_dp_rank
    assert decode_batch(msgspec.msgpack.encode(vllm)) == without(batch, "cache_salt", "session_id")
    for newest in (VllmNewestBatch, VllmMainBatch):  # vLLM 0.33 declares session_id
        vllm = msgspec.msgpack.Decoder(newest).decode(encode_batch(batch, "vllm"))
        assert decode_batch(msgspec.msgpack.encode(vllm)) == without(batch, "cache_salt")
    older = msgspec.msgpack.Decoder(ArrayBatch).decode(encode_batch(batch, "sglang-array"))
    assert decode_batch(msgspec.msgpack.encode(older)) == without(
        batch, "cache_salt", "session_id", "lora_name"
    )


def without(batch: ours.KVEventBatch, *fields: str) -> ours.KVEventBatch:
    """``batch`` with ``fields`` of every BlockStored set to None (what a profile drops)."""
    events = [
        msgspec.structs.replace(e, **dict.fromkeys(fields))
        if isinstance(e, ours.BlockStored)
        else e
        for e in batch.events
    ]
    return ours.KVEventBatch(batch.ts, events, batch.attn_dp_rank)


@pytest.mark.parametrize("profile", PROFILES)
def test_a_string_that_is_not_utf8_is_a_decode_error(profile):
    medium = "\x00GPU"
    payload = encode_batch(ours.KVEventBatch(1.0, [ours.BlockRemoved([1], medium)], 0), profile)
    payload = payload.replace(b"\x00GPU", b"\x80GPU")  # the same length, not UTF-8
    wire = get_profile(profile)
    for decode in (wire.decode, wire.strict_decode):
        with pytest.raises(msgspec.DecodeError, match="not UTF-8"):
            decode(payload)
