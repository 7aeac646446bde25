"""decode_for_index: every profile's batches decoded as decode_any does, tokens left out."""

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
from schedkit.kv_events.index_decode import decode_for_index
from schedkit.kv_events.structs import PROFILES, decode_any


@pytest.mark.parametrize("profile", PROFILES)
def test_a_batch_decodes_as_decode_any_without_its_tokens(profile):
    batch = KVEventBatch(
        1.5,
        [
            BlockStored([1, -2], None, list(range(8)), 4, None, "GPU"),
            BlockStored([3], -2, [70_000, 1, 2, 3], 4, 7, None, "salt", None, "lora"),
            BlockRemoved([1], "GPU"),
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
