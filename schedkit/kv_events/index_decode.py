"""Decoding a KV-event batch for a ``KvIndex``: everything but the stored pages' tokens.

An index reads a ``BlockStored``'s hashes and medium, never its ``token_ids`` (one int per
token: most of a batch's bytes and most of the cost of decoding it). ``decode_for_index``
reads a map-event batch (the ``sglang`` and ``vllm`` profiles) with every ``BlockStored``
field but ``token_ids`` typed as usual and ``token_ids`` left undecoded, and hands back the
in-memory structs with empty ``token_ids``, as a subscriber with ``keep_tokens=False`` does.
A batch of array events (``sglang-array``) is decoded by ``decode_any`` and its tokens
dropped the same way. Errors are ``decode_any``'s.

``index_view`` is the same batch for a router in the publisher's own process: what
``decode_for_index`` makes of the batch's encoding under a profile, built from the in-memory
batch without encoding it (a ``BlockStored`` keeps the fields the profile sends, its hash list
copied), or through the wire when the encoding could exceed ``MAX_BATCH_BYTES``, so that a
batch a subscriber would refuse is refused here too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

import msgspec

from schedkit.kv_events.structs import (
    MAX_BATCH_BYTES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    KVEventBatch,
    decode_any,
    get_profile,
)

__all__ = ["decode_for_index", "index_viewer"]


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
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    locality: str | None = None


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
                    e = _without_tokens(e, e.block_hashes)
                events.append(e)
            return KVEventBatch(raw.ts, events, raw.attn_dp_rank)
    batch = decode_any(payload)
    for event in batch.events:
        if type(event) is BlockStored:
            event.token_ids = []
    return batch


def _without_tokens(e: BlockStored | _StoredHashes, hashes: list[int]) -> BlockStored:
    """``e`` as a ``BlockStored`` with ``hashes`` and no token ids (what the index reads)."""
    return BlockStored(
        hashes,
        e.parent_block_hash,
        [],
        e.block_size,
        e.lora_id,
        e.medium,
        e.cache_salt,
        e.session_id,
        e.lora_name,
        e.group_idx,
        e.kv_cache_spec_kind,
        e.locality,
    )


# Bounds on the msgpack encoding: an int takes at most 9 bytes, a str at most 5 + 4 per
# character, an event's keys and tag fewer than 192 bytes, a batch's own fields fewer than 32.
_INT_BYTES = 9
_EVENT_BYTES = 192
_BATCH_BYTES = 32
_STRINGS = ("medium", "cache_salt", "session_id", "lora_name", "kv_cache_spec_kind", "locality")


def index_viewer(profile: str) -> Callable[[EventBatch], KVEventBatch]:
    """``view(batch)``: ``decode_for_index`` of ``batch`` encoded under ``profile``, without
    the encoding when it fits in ``MAX_BATCH_BYTES`` (see the module docstring)."""
    wire = get_profile(profile)
    dropped = _dropped(wire.convert, BlockStored([], None, [], 1, None))
    dropped_removed = _dropped(wire.convert, BlockRemoved([]))

    def view(batch: EventBatch) -> KVEventBatch:
        if _encoded_bound(batch) > MAX_BATCH_BYTES:
            return decode_for_index(wire.encode(batch))
        events = []
        for e in batch.events:
            kind = type(e)
            if kind is BlockStored:
                e = _without_tokens(e, list(e.block_hashes))
                for name in dropped:
                    setattr(e, name, None)
            elif kind is BlockRemoved:
                e = BlockRemoved(list(e.block_hashes), e.medium, e.group_idx, e.locality)
                for name in dropped_removed:
                    setattr(e, name, None)
            elif kind is AllBlocksCleared:
                e = AllBlocksCleared()
            else:
                return decode_for_index(wire.encode(batch))  # what the wire makes of it
            events.append(e)
        return KVEventBatch(float(batch.ts), events, batch.attn_dp_rank)

    return view


def _dropped(convert: Callable[[Event], msgspec.Struct] | None, event: Event) -> list[str]:
    """The fields of ``event`` that a profile converting with ``convert`` does not send."""
    if convert is None:
        return []
    sent = type(convert(event)).__struct_fields__
    return [name for name in event.__struct_fields__ if name not in sent]


def _encoded_bound(batch: EventBatch) -> int:
    """At least the bytes of ``batch``'s msgpack encoding under any profile."""
    size = _BATCH_BYTES + _EVENT_BYTES * len(batch.events)
    for e in batch.events:
        kind = type(e)
        if kind is BlockStored:
            size += _INT_BYTES * (len(e.block_hashes) + len(e.token_ids) + 5)
            for name in _STRINGS:
                text = getattr(e, name)
                if text is not None:
                    size += 5 + 4 * len(text)
        elif kind is BlockRemoved:
            size += _INT_BYTES * (len(e.block_hashes) + 1)
            for text in (e.medium, e.locality):
                if text is not None:
                    size += 5 + 4 * len(text)
    return size
