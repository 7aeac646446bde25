"""The KV-cache events in memory, as SGLang currently declares them: caches record them,
publishers encode them and subscribers decode into them, whatever the wire profile
(``wire_profiles``). Events are msgspec structs tagged with their class name under ``type``.
Also ``KvMetrics``, the load record a KV-aware router reads.
"""

from __future__ import annotations

from typing import Union

import msgspec

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventBatch",
    "KVCacheEvent",
    "KVEventBatch",
    "KvMetrics",
]

MEDIUM_GPU = "GPU"
# SGLang's StorageMedium.CPU: the host-memory tier (HiCache).
MEDIUM_CPU = "CPU_PINNED"


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True, tag_field="type"):
    """Base of the KV-cache events; on the wire the tag is the class name, under ``type``."""


class BlockStored(KVCacheEvent):
    """Pages newly held by the cache, in order, with the hash of the page before the first;
    ``token_ids`` holds ``block_size`` tokens per hash. The last three fields are vLLM's
    (0.33): the KV-cache group the pages belong to, that group's attention kind (e.g.
    ``"full_attention"``, ``"sliding_window"``) and ``"LOCAL"``/``"REMOTE"``; schedkit's caches
    leave them None, which no profile sends."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    locality: str | None = None


class BlockRemoved(KVCacheEvent):
    """Pages the cache no longer holds (``group_idx`` and ``locality`` as in BlockStored)."""

    block_hashes: list[int]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The cache dropped every page."""


Event = Union[BlockStored, BlockRemoved, AllBlocksCleared]  # noqa: UP007


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    """A timestamped batch of events from one data-parallel rank: ``[ts, events, rank]``."""

    ts: float
    events: list
    attn_dp_rank: int | None = None


class KVEventBatch(EventBatch):
    """The batch type that goes on the wire."""

    events: list[Event]


class KvMetrics(msgspec.Struct, tag=True, array_like=True, gc=False):
    """The load and KV-usage record a KV-aware router reads from each DP rank, encoded as
    SGLang encodes it: ``["KvMetrics", request_active_slots, ...]``. ``gpu_cache_usage_perc``
    and ``gpu_prefix_cache_hit_rate`` are fractions in [0, 1]; the block counts are pages."""

    request_active_slots: int
    request_total_slots: int
    kv_active_blocks: int
    kv_total_blocks: int
    num_requests_waiting: int
    gpu_cache_usage_perc: float
    gpu_prefix_cache_hit_rate: float
    data_parallel_rank: int
