"""decode_for_index: every profile's batches decoded as decode_any does, tokens left out;
index_viewer: the same without the wire."""

from __future__ import annotations

import msgspec
import pytest

from schedkit.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    encode_batch,
)
from schedkit.kv_events.index_decode import decode_for_index, index_viewer
from schedkit.kv_events.structs import MAX_BATCH_BYTES, PROFILES, decode_any
from tests.schedkit.kv_events.newest import hybrid_payloads


@pytest.mark.parametrize("profile", PROFILES)
def test_a_batch_decodes_as_decode_any_without_its_tokens(profile):
    batch = KVEventBatch(
        1.5,
        [
            BlockStored([1, -2], None, list(range(8)), 4, None, "GPU"),
            BlockStored([3], -2, [70_000, 1, 2, 3], 4, 7, None, "salt", None, "lora"),
            BlockStored([5], 3, [1] * 4, 4, None, "CPU", None, "chat", None, 1, "sliding_window"),
            BlockStored([6], 5, [2] * 4, 4, None, "GPU", locality="REMOTE"),
            BlockRemoved([1], "GPU"),
            BlockRemoved([5], "CPU", 1, "LOCAL"),
            AllBlocksCleared(),
        ],
        3,
    )
    payload = encode_batch(batch, profile)
    expected = decode_any(payload)
    for event in expected.events:
        if type(event) is BlockStored:
            event.token_ids = []
    assert decode_for_index(payload) == expected
    view = index_viewer(profile)
    assert view(batch) == expected
    viewed = view(KVEventBatch(2, batch.events, None))  # an int stamp decodes as a float
    assert viewed == decode_for_index(encode_batch(KVEventBatch(2, batch.events), profile))
    assert type(viewed.ts) is float
    assert viewed.events[0].block_hashes is not batch.events[0].block_hashes  # a copy


def test_a_view_past_the_wire_bound_is_refused_as_the_wire_refuses_it():
    removed = KVEventBatch(0.0, [BlockRemoved(list(range(2**40, 2**40 + 500_000)), "GPU")])
    assert len(encode_batch(removed)) > MAX_BATCH_BYTES
    with pytest.raises(msgspec.DecodeError, match="bound"):
        decode_for_index(encode_batch(removed))
    with pytest.raises(msgspec.DecodeError, match="bound"):
        index_viewer("sglang")(removed)


def test_the_newest_vllm_decodes_as_decode_any_without_its_tokens():
    for payload in hybrid_payloads():
        expected = decode_any(payload)
        for event in expected.events:
            if type(event) is BlockStored:
                event.token_ids = []
        assert decode_for_index(payload) == expected


def test_what_is_not_a_batch_is_refused_as_decode_any_refuses_it():
    enc = msgspec.msgpack.encode
    stored = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None}
    for payload in (
        b"\xc1",
        enc([0.0, [{"type": "Nope"}], 0]),
        enc([0.0, [{**stored, "token_ids": "abcd", "block_size": 4, "lora_id": None}], 0]),
        enc([0.0, [{**stored, "token_ids": [1], "block_size": "4", "lora_id": None}], 0]),
    ):
        with pytest.raises(msgspec.DecodeError):
            decode_any(payload)
        with pytest.raises(msgspec.DecodeError):
            decode_for_index(payload)
