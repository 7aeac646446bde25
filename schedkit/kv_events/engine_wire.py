"""Each engine's own declarations of the KV-event structs, one family per wire profile
(``wire_profiles``): the structs the ``sglang-array`` and ``vllm`` profiles encode with, and
with which every profile's payloads are checked (``strict_decode``, ``wire_shape``).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from schedkit.kv_events.event_structs import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    KVCacheEvent,
)

__all__ = [
    "ArrayAllBlocksCleared",
    "ArrayBatch",
    "ArrayBlockRemoved",
    "ArrayBlockStored",
    "SglangBatch",
    "VllmAllBlocksCleared",
    "VllmBatch",
    "VllmBlockRemoved",
    "VllmBlockStored",
    "to_memory",
]


# sglang-array: the tagged-array layout SGLang sent before its events became maps.


class ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class ArrayBlockStored(ArrayEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class ArrayBlockRemoved(ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class ArrayAllBlocksCleared(ArrayEvent, tag="AllBlocksCleared"):
    pass


# vllm: maps tagged under "type" whose medium and lora_name have no default, so both are
# always sent; the defaulted fields vLLM 0.33 added (its KV-cache group and attention kind,
# locality, ...) go out only when set. Block hashes are ints (vLLM's default; bytes hashes are
# refused by ``wire_profiles``).


class VllmEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True, tag_field="type"):
    pass


class VllmBlockStored(VllmEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class VllmBlockRemoved(VllmEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None
    remaining_copy_counts: list[int] | None = None


class VllmAllBlocksCleared(VllmEvent, tag="AllBlocksCleared"):
    pass


# sglang, for checking only (its encoder is schedkit's own structs): exactly SGLang 0.5.23's
# fields, so that a payload with vLLM's fields is not taken for SGLang's.


class SglangBlockStored(KVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class SglangBlockRemoved(KVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class SglangBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Union[SglangBlockStored, SglangBlockRemoved, AllBlocksCleared]]  # noqa: UP007
    attn_dp_rank: int | None = None


class ArrayBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Union[ArrayBlockStored, ArrayBlockRemoved, ArrayAllBlocksCleared]]  # noqa: UP007
    attn_dp_rank: int | None = None


class VllmBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Union[VllmBlockStored, VllmBlockRemoved, VllmAllBlocksCleared]]  # noqa: UP007
    data_parallel_rank: int | None = None


def to_memory(event: msgspec.Struct) -> Event:
    """An event decoded with an engine's declarations, as the in-memory struct."""
    kind = type(event)
    if kind is ArrayBlockStored or kind is SglangBlockStored:
        return BlockStored(*msgspec.structs.astuple(event))
    if kind is VllmBlockStored:
        fields = msgspec.structs.astuple(event)
        return BlockStored(
            *fields[:6],
            session_id=event.session_id,
            lora_name=event.lora_name,
            group_idx=event.group_idx,
            kv_cache_spec_kind=event.kv_cache_spec_kind,
            locality=event.locality,
        )
    if kind is VllmBlockRemoved:
        return BlockRemoved(event.block_hashes, event.medium, event.group_idx, event.locality)
    if kind is ArrayBlockRemoved or kind is SglangBlockRemoved:
        return BlockRemoved(event.block_hashes, event.medium)
    return AllBlocksCleared()
