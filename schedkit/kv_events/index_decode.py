"""Decoding a KV-event batch for a ``KvIndex``: everything but the stored pages' tokens.

An index reads a ``BlockStored``'s hashes and medium, never its ``token_ids`` (one int per
token: most of a batch's bytes and most of the cost of decoding it). ``decode_for_index``
reads a map-event batch (the ``sglang`` and ``vllm`` profiles) with every ``BlockStored``
field but ``token_ids`` typed as usual and ``token_ids`` left undecoded, and hands back the
in-memory structs with empty ``token_ids``, as a subscriber with ``keep_tokens=False`` does.
A batch of array events (``sglang-array``) is decoded by ``decode_any`` and its tokens
dropped the same way. Errors are ``decode_any``'s.
"""

from __future__ import annotations

from typing import Union

import msgspec

from schedkit.kv_events.structs import (
    MAX_BATCH_BYTES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_any,
)

__all__ = ["decode_for_index"]


class _StoredHashes(msgspec.Struct, tag="BlockStored", tag_field="type", gc=False):
    """``BlockStored`` as a map, its tokens kept as undecoded bytes."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: msgspec.Raw
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class _IndexBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Union[_StoredHashes, BlockRemoved, AllBlocksCleared]]  # noqa: UP007
    attn_dp_rank: int | None = None


_decode_index_batch = msgspec.msgpack.Decoder(_IndexBatch).decode
# The first byte of a msgpack array: fixarray (0x90-0x9f), array 16, array 32.
_ARRAY_HEADS = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])


def decode_for_index(payload: bytes) -> KVEventBatch:
    """The batch in ``payload`` (any profile) with every ``BlockStored``'s ``token_ids``
    empty; ``msgspec.DecodeError`` as ``decode_any`` for anything that is not a batch. Of the
    tokens only their being a msgpack array is checked."""
    if len(payload) <= MAX_BATCH_BYTES:
        try:
            raw = _decode_index_batch(payload)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            raw = None  # array events, or not a batch: decode_any tells which
        if raw is not None:
            events = []
            for e in raw.events:
                if type(e) is _StoredHashes:
                    if memoryview(e.token_ids)[0] not in _ARRAY_HEADS:
                        return decode_any(payload)  # raises, naming what is wrong
                    e = BlockStored(
                        e.block_hashes,
                        e.parent_block_hash,
                        [],
                        e.block_size,
                        e.lora_id,
                        e.medium,
                        e.cache_salt,
                        e.session_id,
                        e.lora_name,
                    )
                events.append(e)
            return KVEventBatch(raw.ts, events, raw.attn_dp_rank)
    batch = decode_any(payload)
    for event in batch.events:
        if type(event) is BlockStored:
            event.token_ids = []
    return batch
