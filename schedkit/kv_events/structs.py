"""KV-cache event structs and their wire encodings, one profile per engine release
(``sglang``, ``sglang-array``, ``vllm``).

The in-memory structs (and ``KvMetrics``) are in ``event_structs``, the profiles and what each
engine puts on the wire in ``wire_profiles``; this module names both.
"""

from __future__ import annotations

from schedkit.kv_events.event_structs import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    KVCacheEvent,
    KVEventBatch,
    KvMetrics,
)
from schedkit.kv_events.wire_profiles import (
    MAX_BATCH_BYTES,
    PROFILES,
    Profile,
    ProfileName,
    decode_any,
    decode_batch,
    encode_batch,
    get_profile,
)

__all__ = [
    "MAX_BATCH_BYTES",
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "PROFILES",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventBatch",
    "KVCacheEvent",
    "KVEventBatch",
    "KvMetrics",
    "Profile",
    "ProfileName",
    "decode_any",
    "decode_batch",
    "encode_batch",
    "get_profile",
]
