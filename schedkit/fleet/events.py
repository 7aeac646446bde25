"""KV events handed from a worker to a router in the same process.

``publisher: queue`` in a ``kv_events_config`` makes the worker's ``KvEventsPublisher`` encode
each batch exactly as the ZeroMQ publisher puts it on the wire (the config's profile) and
keep it, with its seq, under its endpoint (``inproc://name`` + ``_dp<rank>``, as any publisher
offsets it) until the router ``take()``s it. ``attach(endpoint)`` finds it. The offline fleet
uses it so that its router's index is fed by the same event batches the workers publish,
deterministically and without sockets. A consumer that only indexes pages calls
``keep_for_index()`` first: each batch is then kept as ``decode_for_index`` would read its
encoding (``schedkit.kv_events.index_decode.index_viewer``) and ``take()`` hands those over,
without encoding and decoding it.
"""

from __future__ import annotations

from collections.abc import Callable

from schedkit.kv_events import EventBatch, KvEventsConfig, offset_endpoint, register_publisher
from schedkit.kv_events.index_decode import index_viewer
from schedkit.kv_events.structs import KVEventBatch, get_profile

__all__ = ["QueueEventPublisher", "attach"]

_BOUND: dict[str, QueueEventPublisher] = {}


class QueueEventPublisher:
    """Keeps each published batch's wire encoding (or its index view, after
    ``keep_for_index()``) in memory until ``take()``."""

    def __init__(self, config: KvEventsConfig, dp_rank: int = 0) -> None:
        endpoint = offset_endpoint(config.endpoint, dp_rank)
        if not endpoint.startswith("inproc://"):
            raise ValueError(
                f"the queue KV-event publisher takes an inproc://name endpoint, got "
                f"{config.endpoint!r}"
            )
        if endpoint in _BOUND:
            raise ValueError(f"KV-event endpoint {endpoint!r} is already in use in this process")
        self.endpoint = endpoint
        self.replay_endpoint = None
        self.accepted = self.published = self.dropped = self.encode_errors = 0
        self.profile = config.profile
        self._encode: Callable[[EventBatch], bytes | KVEventBatch] = get_profile(
            config.profile
        ).encode
        self._pending: list[tuple[int, bytes | KVEventBatch]] = []
        self._closed = False
        _BOUND[endpoint] = self

    @property
    def queue_depth(self) -> int:
        """Batches published and not taken yet."""
        return len(self._pending)

    @property
    def last_seq(self) -> int:
        """The seq of the last batch taken in (-1 before the first)."""
        return self.accepted - 1

    def keep_for_index(self) -> None:
        """Keep each batch published from now on as a ``KvIndex`` reads it off the wire
        (``decode_for_index`` of its encoding), not encoded; ``take()`` returns those."""
        if self.accepted:
            raise RuntimeError("keep_for_index() must come before the first batch")
        self._encode = index_viewer(self.profile)

    def publish(self, batch: EventBatch) -> bool:
        """Encode (or view) and keep ``batch``; False (and a drop) after shutdown."""
        if self._closed:
            self.dropped += 1
            return False
        self._pending.append((self.accepted, self._encode(batch)))
        self.accepted += 1
        self.published += 1
        return True

    def take(self) -> list[tuple[int, bytes | KVEventBatch]]:
        """The (seq, payload) pairs published since the last call, in order: each payload
        the batch's encoding, or its index view after ``keep_for_index()``."""
        pending, self._pending = self._pending, []
        return pending

    def flush(self, timeout: float = 5.0) -> bool:
        """Nothing to wait for: a batch is ready as soon as it is published."""
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        """Refuse further batches and free the endpoint (untaken batches stay takeable)."""
        self._closed = True
        if _BOUND.get(self.endpoint) is self:
            del _BOUND[self.endpoint]


def attach(endpoint: str) -> QueueEventPublisher:
    """The queue publisher bound at ``endpoint``; LookupError when there is none."""
    try:
        return _BOUND[endpoint]
    except KeyError:
        raise LookupError(f"no queue KV-event publisher at {endpoint!r}") from None


register_publisher("queue", QueueEventPublisher)
