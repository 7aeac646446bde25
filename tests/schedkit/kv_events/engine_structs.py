"""The engines' own KV-event struct declarations, written out here independently of schedkit's
(as SGLang and vLLM declare them), so that golden and conformance tests decode and encode the
wire with them: a change to schedkit's structs that breaks the wire shows up as a failure.
"""

from __future__ import annotations

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
]


# SGLang 0.5.23's declarations (sglang/srt/disaggregation/kv_events.py): events are maps
# tagged under "type", None-valued optional fields left out; the batch is a plain array.
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


# vLLM 0.33's declarations (vllm/distributed/kv_events.py): maps tagged under "type"; medium
# and lora_name have no default.
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
