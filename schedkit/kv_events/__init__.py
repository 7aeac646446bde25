"""KV-cache events: wire structs and profiles, page hashes, publishers, subscriber and index."""

from schedkit.kv_events.hashing import digest_to_int, namespace_seed, page_digests, page_hashes
from schedkit.kv_events.structs import (
    PROFILES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVCacheEvent,
    KVEventBatch,
    Profile,
    decode_batch,
    encode_batch,
    get_profile,
)

__all__ = [
    "PROFILES",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVCacheEvent",
    "KVEventBatch",
    "Profile",
    "decode_batch",
    "digest_to_int",
    "encode_batch",
    "get_profile",
    "namespace_seed",
    "page_digests",
    "page_hashes",
]
