"""The engines' own KV-event struct declarations, written out here independently of schedkit's
(as SGLang and vLLM declare them), so that golden and conformance tests decode and encode the
wire with them: a change to schedkit's structs that breaks the wire shows up as a failure.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "AllBlocksCleared",
    "ArrayAllBlocksCleared",
    "ArrayBatch",
    "ArrayBlockRemoved",
    "ArrayBlockStored",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVEventBatch",
    "VllmAllBlocksCleared",
    "VllmBatch",
    "VllmBlockRemoved",
    "VllmBlockStored",
    "VllmMainBatch",
    "VllmMainBlockRemoved",
    "VllmNewestAllBlocksCleared",
    "VllmNewestBatch",
    "VllmNewestBlockRemoved",
    "VllmNewestBlockStored",
]


# SGLang 0.5.23's declarations (sglang/srt/disaggregation/kv_events.py): events are maps
# tagged under "type", None-valued optional fields left out; the batch is a plain array.
# 0.5.23 is also SGLang's newest release (its wheel's kv_events.py declares exactly these).
class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True, tag_field="type"):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list
    attn_dp_rank: int | None = None


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# SGLang before 0.5.23 (what llm-d's adapter reads): tagged arrays.
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


class ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[ArrayBlockStored | ArrayBlockRemoved | ArrayAllBlocksCleared]
    attn_dp_rank: int | None = None


# vLLM's required fields (vllm/distributed/kv_events.py, as consumers written against vLLM
# before its defaulted metadata fields read them): maps tagged under "type"; medium and
# lora_name have no default. The 0.33.0 wheel declares more, all defaulted: VllmNewest* below.
class VllmEvent(msgspec.Struct, gc=False, tag=True, tag_field="type"):
    pass


class VllmBlockStored(VllmEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class VllmBlockRemoved(VllmEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class VllmAllBlocksCleared(VllmEvent, tag="AllBlocksCleared"):
    pass


class VllmBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared]
    data_parallel_rank: int | None = None


# vLLM 0.33.0's declarations as its wheel ships them (vllm/distributed/kv_events.py, PyPI's
# newest release): omit_defaults events, so the defaulted fields go out only when set.
# ExternalBlockHash is ``bytes | int``: int by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1,
# the SHA-256 page hash's low 64 bits, unsigned), the raw hash bytes with the variable at 0.
ExternalBlockHash = bytes | int


class VllmNewestEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class VllmNewestBlockStored(VllmNewestEvent, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
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


class VllmNewestBlockRemoved(VllmNewestEvent, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class VllmNewestAllBlocksCleared(VllmNewestEvent, tag="AllBlocksCleared"):
    pass


class VllmNewestBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[VllmNewestBlockStored | VllmNewestBlockRemoved | VllmNewestAllBlocksCleared]
    data_parallel_rank: int | None = None


# vLLM's main branch after 0.33.0 (its own wire-compatibility test declares it):
# BlockRemoved also carries remaining_copy_counts, one count per hash.
class VllmMainBlockRemoved(VllmNewestEvent, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None
    remaining_copy_counts: list[int] | None = None


class VllmMainBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[VllmNewestBlockStored | VllmMainBlockRemoved | VllmNewestAllBlocksCleared]
    data_parallel_rank: int | None = None
