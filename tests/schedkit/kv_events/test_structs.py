"""Golden tests: what we encode decodes with the engines' own struct declarations, and back.

The structs below are declared here independently, as SGLang and vLLM declare them, so that a
change to schedkit's structs that breaks the wire shows up as a failure here.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedkit.kv_events import structs as ours
from schedkit.kv_events.structs import decode_batch, encode_batch

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


# SGLang's declarations (sglang/srt/disaggregation/kv_events.py).
class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    attn_dp_rank: int | None = None


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# vLLM-profile declarations: events are maps tagged under "type", the batch is an array.
class VllmEvent(msgspec.Struct, omit_defaults=True, gc=False, tag_field="type"):
    pass


class VllmBlockStored(VllmEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    lora_name: str | None = None


class VllmBlockRemoved(VllmEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class VllmAllBlocksCleared(VllmEvent, tag="AllBlocksCleared"):
    pass


class VllmBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared]
    data_parallel_rank: int | None = None


def golden_batch(stored, removed, cleared, batch):
    """The same six events, built from one family of struct classes (all positional)."""
    return batch(
        1700000000.25,
        [
            stored([INT64_MIN, INT64_MAX], None, [1, 2, 3, 4], 2, None, "GPU"),
            stored([-7], INT64_MAX, [5, 6], 2, 3, "CPU_PINNED"),
            stored([11], -7, [7, 8], 2, None),
            removed([INT64_MIN], "GPU"),
            removed([11]),
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


def vllm_batch() -> VllmBatch:
    return golden_batch(VllmBlockStored, VllmBlockRemoved, VllmAllBlocksCleared, VllmBatch)


def as_builtins(obj) -> object:
    return msgspec.to_builtins(obj)


def test_sglang_profile_is_byte_identical_to_sglang_structs():
    assert encode_batch(our_batch(), "sglang") == msgspec.msgpack.encode(sglang_batch())


def test_sglang_structs_decode_what_we_send():
    decoded = msgspec.msgpack.Decoder(KVEventBatch).decode(encode_batch(our_batch(), "sglang"))
    assert decoded == sglang_batch()


def test_we_decode_what_sglang_sends():
    payload = msgspec.msgpack.encode(sglang_batch())
    assert decode_batch(payload, "sglang") == our_batch()


def test_sglang_wire_shape():
    raw = msgspec.msgpack.decode(encode_batch(our_batch(), "sglang"))
    assert raw[0] == 1700000000.25
    assert raw[2] == 3
    assert raw[1][0] == ["BlockStored", [INT64_MIN, INT64_MAX], None, [1, 2, 3, 4], 2, None, "GPU"]
    assert raw[1][3] == ["BlockRemoved", [INT64_MIN], "GPU"]
    assert raw[1][5] == ["AllBlocksCleared"]


def test_vllm_structs_decode_what_we_send():
    payload = encode_batch(our_batch(), "vllm")
    assert msgspec.msgpack.Decoder(VllmBatch).decode(payload) == vllm_batch()


def test_we_decode_what_vllm_sends():
    batch = vllm_batch()
    batch.events[0].lora_name = "adapter-a"  # a field we do not keep
    assert decode_batch(msgspec.msgpack.encode(batch), "vllm") == our_batch()


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
    }
    assert raw[1][3] == {"type": "BlockRemoved", "block_hashes": [INT64_MIN], "medium": "GPU"}
    assert raw[1][5] == {"type": "AllBlocksCleared"}


def test_profiles_are_not_interchangeable():
    with pytest.raises(msgspec.ValidationError):
        decode_batch(encode_batch(our_batch(), "vllm"), "sglang")


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
def test_both_profiles_agree_with_engine_structs(batch):
    sglang = msgspec.msgpack.Decoder(KVEventBatch).decode(encode_batch(batch, "sglang"))
    ts, events, rank = as_builtins(batch)
    # The sglang profile leaves out the fields SGLang's array layout does not have.
    events = [e[:7] if e[0] == "BlockStored" else e for e in events]
    assert as_builtins(sglang) == [ts, events, rank]
    assert decode_batch(msgspec.msgpack.encode(sglang), "sglang") == batch
    vllm = msgspec.msgpack.Decoder(VllmBatch).decode(encode_batch(batch, "vllm"))
    assert vllm.ts == batch.ts and vllm.data_parallel_rank == batch.attn_dp_rank
    assert decode_batch(msgspec.msgpack.encode(vllm), "vllm") == batch
