"""Publishing the tree cache's KV events and the scheduler's KV metrics, after SGLang's
SchedulerKvEventsPublisher.

Exactly one scheduler per data-parallel rank publishes: the one with ``attn_tp_rank == 0``,
``attn_cp_rank == 0`` and ``pp_rank == 0`` (``ParallelState.publishes_kv_events``). The tree
cache's ``enable_kv_cache_events`` must come from the same predicate, e.g.
``enable_kv_cache_events: !ref parallel_state.publishes_kv_events`` in a wiring, so that the
other ranks' caches record nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import msgspec
import structlog
import zmq

from schedkit.core.component import ArgumentError, at_least, component
from schedkit.core.parallel_state import ParallelState
from schedkit.kv_events import EventPublisher, KVEventBatch, KvEventsConfig, create_publisher
from schedkit.kv_events.config import parse_kv_events_config
from schedkit.kv_events.factory import check_publisher_config
from schedkit.kv_events.structs import KvMetrics

__all__ = ["EventSource", "KvEventsPublisher", "kv_events_dp_rank"]

log = structlog.get_logger(__name__)

_METRICS_LINGER = 0.1  # seconds queued KV metrics may still go out at shutdown


class EventSource(Protocol):
    """What the publisher needs from a tree cache."""

    def take_events(self) -> list: ...


def kv_events_dp_rank(parallel_state: ParallelState) -> int:
    """The DP rank a scheduler publishes under: its attention DP rank with DP attention,
    otherwise its data-parallel rank (0 when unset)."""
    if parallel_state.enable_dp_attention:
        return parallel_state.attn_dp_rank
    return parallel_state.dp_rank or 0


@component("kv_events_publisher")
class KvEventsPublisher:
    """Sends the tree cache's pending KV events as one batch per call, and KV metrics.

    Enabled only when ``kv_events_config`` is given (None or an empty string means off;
    nothing else is read then) and this rank publishes (see the module docstring). The
    publisher binds ``endpoint`` + DP rank. ``metrics_endpoint`` is a ZeroMQ endpoint that a
    PUSH socket connects to (the metrics consumer binds it); each ``emit_kv_metrics`` sends
    one msgpack-encoded ``KvMetrics`` without blocking (a full queue counts in
    ``metrics_dropped``). ``get_stats`` returns the metrics reporter's ``SchedulerStats``.
    Batches and metrics carry ``dp_rank`` (``kv_events_dp_rank``): the data-parallel rank,
    or the attention DP rank under DP attention, where every scheduler shares one dp_rank.
    """

    # A mapping is accepted too (parsed like the JSON string); from a wiring file a mapping
    # arrives already converted to a KvEventsConfig.
    kv_events_config: KvEventsConfig | str | None = None
    parallel_state: ParallelState = attrs.field(factory=ParallelState)
    tree_cache: EventSource
    metrics_endpoint: str | None = None
    max_running_requests: int = attrs.field(validator=at_least(1))
    max_total_num_tokens: int = attrs.field(validator=at_least(0))
    page_size: int = attrs.field(default=1, validator=at_least(1))
    get_stats: Callable[[], Any]
    now: Callable[[], float] = time.time

    dp_rank: int = attrs.field(init=False, default=0)
    metrics_dropped: int = attrs.field(init=False, default=0)
    _publisher: EventPublisher | None = attrs.field(init=False, default=None, repr=False)
    _context: zmq.Context | None = attrs.field(init=False, default=None, repr=False)
    _metrics: zmq.Socket | None = attrs.field(init=False, default=None, repr=False)
    _encode: Callable[[Any], bytes] = attrs.field(init=False, repr=False)
    _take_events: Callable[[], list] = attrs.field(init=False, repr=False)
    # Events taken from the cache by ``has_pending_events``, published first by the next
    # ``publish_kv_events``.
    _held: list = attrs.field(init=False, repr=False, factory=list)
    _discard: bool = attrs.field(init=False, default=False, repr=False)
    _shut_down: bool = attrs.field(init=False, default=False, repr=False)

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too): the
        config parses, its publisher exists and could open its endpoints, and
        ``metrics_endpoint`` is a ZeroMQ endpoint."""
        try:
            config = parse_kv_events_config(args.kv_events_config)
        except ValueError as exc:
            raise ArgumentError("kv_events_config", str(exc)) from None
        if config is not None:
            try:
                check_publisher_config(config)
            except ArgumentError as exc:
                raise ArgumentError(
                    f"kv_events_config.{exc.argument}", f"kv_events_config.{exc.argument}: {exc}"
                ) from None
        endpoint = args.metrics_endpoint
        if endpoint is not None and not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise ArgumentError(
                "metrics_endpoint",
                f"metrics_endpoint {endpoint!r} is not a ZeroMQ endpoint; use tcp://host:port, "
                "ipc://path or inproc://name",
            )

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)
        take_events = getattr(self.tree_cache, "take_events", None)
        if not callable(take_events):
            raise ValueError(
                f"tree_cache must have a take_events() method (a RadixCache or SWARadixCache), "
                f"got {type(self.tree_cache).__name__}"
            )
        self._take_events = take_events
        self._encode = msgspec.msgpack.Encoder().encode
        self.kv_events_config = parse_kv_events_config(self.kv_events_config)
        if self.kv_events_config is None or not self.parallel_state.publishes_kv_events:
            if getattr(self.tree_cache, "enable_kv_cache_events", False):
                # Nobody would publish the events: drop them rather than let them pile up.
                self._discard = True
                log.warning(
                    "kv_events.cache_records_unpublished_events",
                    hint="set the cache's enable_kv_cache_events from the same predicate: "
                    "!ref parallel_state.publishes_kv_events, and false without kv_events_config",
                )
            return
        self.dp_rank = kv_events_dp_rank(self.parallel_state)
        self._publisher = create_publisher(self.kv_events_config, dp_rank=self.dp_rank)
        if self.metrics_endpoint is not None:
            self._open_metrics_socket(self.metrics_endpoint)

    def _open_metrics_socket(self, endpoint: str) -> None:
        self._context = zmq.Context()
        self._metrics = self._context.socket(zmq.PUSH)
        try:
            self._metrics.connect(endpoint)
        except zmq.ZMQError as exc:
            self._metrics.close(linger=0)
            self._context.term()
            self._publisher.shutdown(timeout=0)
            raise ValueError(
                f"cannot connect the KV metrics socket to {endpoint!r}: {exc.strerror}"
            ) from None

    @property
    def enabled(self) -> bool:
        """True when this rank publishes KV events."""
        return self._publisher is not None

    @property
    def endpoint(self) -> str | None:
        """The endpoint events are published on (None when disabled)."""
        return getattr(self._publisher, "endpoint", None)

    @property
    def replay_endpoint(self) -> str | None:
        """The replay endpoint (None when disabled or without replay)."""
        return getattr(self._publisher, "replay_endpoint", None)

    @property
    def last_seq(self) -> int:
        """The last seq the publisher took (-1 before the first, or when disabled)."""
        return getattr(self._publisher, "last_seq", -1)

    @property
    def accepted(self) -> int:
        """Batches the publisher took (all of them are sent unless shutdown times out)."""
        return 0 if self._publisher is None else self._publisher.accepted

    @property
    def published(self) -> int:
        """Batches the publisher has sent."""
        return 0 if self._publisher is None else self._publisher.published

    @property
    def dropped(self) -> int:
        """Batches the publisher refused (full queue, or after shutdown)."""
        return 0 if self._publisher is None else self._publisher.dropped

    def publish_kv_events(self) -> None:
        """Publish the cache's pending events as one batch stamped with ``now()`` and the DP
        rank; nothing when there are none, or when disabled (a cache that records events on
        a disabled rank, a wiring mistake, has them dropped instead of kept forever)."""
        publisher = self._publisher
        if publisher is None:
            if self._discard:
                self._take_events()
            return
        events = self._take_events()
        if self._held:
            events, self._held = self._held + events, []
        if events:
            publisher.publish(KVEventBatch(self.now(), events, self.dp_rank))

    def has_pending_events(self) -> bool:
        """Whether ``publish_kv_events`` would publish a batch now (the cache's new events
        are kept for it, in order); False when disabled."""
        if self._publisher is None:
            if self._discard:
                self._take_events()
            return False
        events = self._take_events()
        if events:
            self._held += events
        return bool(self._held)

    def kv_metrics(self) -> KvMetrics:
        """The ``KvMetrics`` record for the current stats."""
        stats = self.get_stats()
        kv_total_blocks = self.max_total_num_tokens // self.page_size
        return KvMetrics(
            request_active_slots=stats.num_running_reqs,
            request_total_slots=self.max_running_requests,
            kv_active_blocks=int(stats.token_usage * kv_total_blocks),
            kv_total_blocks=kv_total_blocks,
            num_requests_waiting=stats.num_queue_reqs,
            gpu_cache_usage_perc=stats.token_usage,
            gpu_prefix_cache_hit_rate=stats.cache_hit_rate,
            data_parallel_rank=self.dp_rank,
        )

    def emit_kv_metrics(self) -> None:
        """Send one ``KvMetrics`` record on the metrics socket, unless disabled, without a
        metrics endpoint, or closed."""
        sock = self._metrics
        if sock is None or sock.closed:
            return
        try:
            sock.send(self._encode(self.kv_metrics()), zmq.NOBLOCK)
        except zmq.Again:
            self.metrics_dropped += 1

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every batch published so far is on the socket; False on timeout."""
        return True if self._publisher is None else self._publisher.flush(timeout)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Publish what the cache still holds, deliver every accepted batch (waiting up to
        ``timeout`` seconds), then close the sockets (queued metrics get 0.1 s). Safe to call
        more than once."""
        if self._shut_down:
            return
        self._shut_down = True
        if self._publisher is None:
            return
        self.publish_kv_events()
        self._publisher.shutdown(timeout)
        if self._metrics is not None:
            # Metrics are snapshots: a missing consumer must not hold shutdown up for long.
            self._metrics.close(linger=int(min(timeout, _METRICS_LINGER) * 1000))
            self._context.term()
