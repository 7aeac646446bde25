"""KV-cache events: wire structs and profiles, page hashes, publishers, subscriber and index.

Names load on first use, so that importing one of them does not import ZeroMQ or the rest.
"""

from schedkit._lazy import lazy_attributes

_LAZY = {
    "AllBlocksCleared": "schedkit.kv_events.event_structs",
    "BlockRemoved": "schedkit.kv_events.event_structs",
    "BlockStored": "schedkit.kv_events.event_structs",
    "create_publisher": "schedkit.kv_events.factory",
    "decode_batch": "schedkit.kv_events.wire_profiles",
    "digest_to_int": "schedkit.kv_events.hashing",
    "encode_batch": "schedkit.kv_events.wire_profiles",
    "EventBatch": "schedkit.kv_events.event_structs",
    "EventPublisher": "schedkit.kv_events.config",
    "GapDetected": "schedkit.kv_events.notices",
    "GapFilled": "schedkit.kv_events.notices",
    "get_profile": "schedkit.kv_events.wire_profiles",
    "HistoryLost": "schedkit.kv_events.notices",
    "KVCacheEvent": "schedkit.kv_events.event_structs",
    "KVEventBatch": "schedkit.kv_events.event_structs",
    "KvEventsConfig": "schedkit.kv_events.config",
    "KvEventSubscriber": "schedkit.kv_events.subscriber",
    "KvIndex": "schedkit.kv_events.index",
    "KvMetrics": "schedkit.kv_events.event_structs",
    "namespace_seed": "schedkit.kv_events.hashing",
    "Notice": "schedkit.kv_events.notices",
    "NullEventPublisher": "schedkit.kv_events.null_publisher",
    "offset_endpoint": "schedkit.kv_events.config",
    "page_digests": "schedkit.kv_events.hashing",
    "page_hashes": "schedkit.kv_events.hashing",
    "parse_kv_events_config": "schedkit.kv_events.config",
    "Profile": "schedkit.kv_events.wire_profiles",
    "PROFILES": "schedkit.kv_events.wire_profiles",
    "PublisherRestarted": "schedkit.kv_events.notices",
    "register_publisher": "schedkit.kv_events.factory",
    "salt_seed": "schedkit.kv_events.hashing",
    "ZmqEventPublisher": "schedkit.kv_events.zmq_publisher",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
