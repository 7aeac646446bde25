"""KV-cache event structs and their wire encodings, one profile per engine release.

The in-memory structs are SGLang's current declarations: events are msgspec structs tagged with
their class name under ``type``, and caches record them, publishers encode them, subscribers
decode into them whatever the profile on the wire. The profile table, ``PROFILES``, is the one
place that says what each engine puts on the wire:

- ``sglang`` (SGLang >= 0.5.23): each event a msgpack map ``{"type": "BlockStored", ...}`` with
  None-valued optional fields left out; the batch ``[ts, events, attn_dp_rank]``.
- ``sglang-array`` (older SGLang, what llm-d's adapter reads): each event a msgpack array whose
  first element is the tag: ``["BlockStored", hashes, parent, tokens, block_size, lora_id,
  medium]``.
- ``vllm`` (vLLM >= 0.33): each event a map tagged under ``type``; ``BlockStored`` always carries
  ``medium`` and ``lora_name`` and ``BlockRemoved`` always carries ``medium``, None included.

Decoding does not need to know the profile: each event is read as a map or an array by its
first byte, so a subscriber follows any of these streams.

The in-memory structs (and ``KvMetrics``) are in ``event_structs``, the profiles in
``wire_profiles``; this module names both.
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
