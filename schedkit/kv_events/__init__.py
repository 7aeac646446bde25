"""KV-cache events: wire structs and profiles, page hashes, publishers, subscriber and index."""

from schedkit.kv_events.config import (
    EventPublisher,
    KvEventsConfig,
    create_publisher,
    offset_endpoint,
    parse_kv_events_config,
    register_publisher,
)
from schedkit.kv_events.hashing import digest_to_int, namespace_seed, page_digests, page_hashes
from schedkit.kv_events.index import KvIndex
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
from schedkit.kv_events.subscriber import (
    GapDetected,
    GapFilled,
    HistoryLost,
    KvEventSubscriber,
    Notice,
    PublisherRestarted,
)
from schedkit.kv_events.zmq_publisher import NullEventPublisher, ZmqEventPublisher

__all__ = [
    "PROFILES",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "EventPublisher",
    "GapDetected",
    "GapFilled",
    "HistoryLost",
    "KVCacheEvent",
    "KVEventBatch",
    "KvEventSubscriber",
    "KvEventsConfig",
    "KvIndex",
    "Notice",
    "NullEventPublisher",
    "Profile",
    "PublisherRestarted",
    "ZmqEventPublisher",
    "create_publisher",
    "decode_batch",
    "digest_to_int",
    "encode_batch",
    "get_profile",
    "namespace_seed",
    "offset_endpoint",
    "page_digests",
    "page_hashes",
    "parse_kv_events_config",
    "register_publisher",
]
