"""The ZeroMQ KV-event publisher, registered as ``zmq``: a bounded queue filled by the caller
and the sender thread that empties it.

``ZmqEventPublisher.publish`` only appends to a bounded queue. A sender thread encodes each
batch under the configured profile, hands the payload to the replay buffer and sends it as
``[topic, seq, payload]``. The sender polls the queue every ``POLL_INTERVAL`` seconds instead of
being woken by each ``publish``, so the common call (once per scheduler step) costs a deque
append and no system call; see ``ZmqEventPublisher`` for the latency this buys. Its sockets
are opened by ``publisher_sockets``; the ``null`` publisher is ``null_publisher``'s.

(Longer than 300 lines: the caller's side and the sender thread share one queue and its
wake-up protocol, which read best together.)
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque

import structlog
import zmq

from schedkit.kv_events.config import KvEventsConfig
from schedkit.kv_events.event_structs import EventBatch, KVEventBatch
from schedkit.kv_events.publisher_sockets import check_publisher_endpoints, open_publisher_sockets
from schedkit.kv_events.replay import END_SEQ
from schedkit.kv_events.wire_profiles import get_profile

__all__ = ["END_SEQ", "IDLE_AFTER", "POLL_INTERVAL", "ZmqEventPublisher"]

log = structlog.get_logger(__name__)

POLL_INTERVAL = 0.001  # seconds between the sender's looks at the queue while batches come
IDLE_AFTER = 0.1  # seconds without a batch after which the sender sleeps until woken
_WAKE_FRACTION = 4  # publish() wakes the sender when the queue reaches 1/4 of its bound


class ZmqEventPublisher:
    """Publishes event batches on a ZeroMQ PUB socket, with an optional replay ROUTER.

    Counters: ``accepted`` batches taken by ``publish``, ``published`` batches sent,
    ``dropped`` refused (full queue, after shutdown), ``encode_errors``, ``heartbeats``.

    ``publish`` never blocks and may be called from several threads: it takes the next seq
    and appends to a queue of at most ``max_queue_size`` batches under one lock, so seq order
    is send order (a full queue drops the batch, the seq stays used: consumers see the gap).
    A sender thread owns the PUB socket: it encodes, sends and buffers batches for replay,
    which a ``ReplayServer`` thread serves. After ``heartbeat_interval`` seconds without a
    batch the sender publishes an empty one (counted in ``heartbeats``, not ``published``), so
    that a subscriber that missed the last batches notices the gap while nothing happens;
    every engine's consumer decodes an empty batch as a no-op. ``epoch`` (8 random bytes)
    names this publisher's lifetime; the replay socket tells it to subscribers that ask.
    tcp endpoints are bound on loopback only, unless ``allow_remote`` (``publisher_sockets``).

    Latency: while batches keep coming the sender looks at the queue every ``POLL_INTERVAL``
    (1 ms), so a batch is on the socket within about 1 ms of ``publish``, plus however long
    the publishing thread keeps the GIL (at most ``sys.getswitchinterval()``, 5 ms by
    default). After ``IDLE_AFTER`` (100 ms) without a batch the sender sleeps until the next
    ``publish`` wakes it; ``publish`` also wakes it at once when the queue reaches a quarter of
    ``max_queue_size``, and ``flush`` and ``shutdown`` always do. With ``start=False`` the
    threads wait for ``start()``; until then ``flush()`` sends on the caller's thread.
    """

    __slots__ = (
        "_asleep",
        "_closed",
        "_context",
        "_encode",
        "_heartbeat",
        "_last_send",
        "_linger_ms",
        "_max_queue_size",
        "_next_seq",
        "_own_context",
        "_pub",
        "_publish_lock",
        "_queue",
        "_replay",
        "_sender",
        "_shutdown_lock",
        "_stopping",
        "_topic",
        "_wake_at",
        "_wakeup",
        "accepted",
        "config",
        "dp_rank",
        "dropped",
        "encode_errors",
        "endpoint",
        "epoch",
        "heartbeats",
        "published",
    )

    def __init__(
        self,
        config: KvEventsConfig,
        dp_rank: int = 0,
        context: zmq.Context | None = None,
        *,
        start: bool = True,
    ) -> None:
        if dp_rank < 0:
            raise ValueError(f"dp_rank must be >= 0, got {dp_rank}")
        self.check_config(config, dp_rank)
        self.config = config
        self.dp_rank = dp_rank
        self.accepted = 0
        self.published = 0
        self.dropped = 0
        self.encode_errors = 0
        self.heartbeats = 0
        self.epoch = os.urandom(8)
        self._heartbeat = config.heartbeat_interval
        self._last_send = time.monotonic()
        self._publish_lock = threading.Lock()
        self._encode = get_profile(config.profile).encode
        self._topic = config.topic.encode()
        self._max_queue_size = config.max_queue_size
        # Depth before an append that makes the queue reach its wake-up mark.
        self._wake_at = max(1, config.max_queue_size // _WAKE_FRACTION) - 1
        self._queue: deque = deque()
        self._next_seq = 0
        # Held while no wakeup is pending: releasing it wakes the sender. Unlike a pipe
        # write, a release does not give up the GIL to the woken thread.
        self._wakeup = threading.Lock()
        self._wakeup.acquire()
        self._asleep = False
        self._closed = False
        self._stopping = False
        self._linger_ms = 0
        self._sender: threading.Thread | None = None
        self._shutdown_lock = threading.Lock()
        self._own_context = context is None
        self._context = zmq.Context() if context is None else context
        self._pub, self.endpoint, self._replay = open_publisher_sockets(
            config,
            dp_rank,
            self._context,
            own_context=self._own_context,
            topic=self._topic,
            epoch=self.epoch,
        )
        log.info(
            "kv_events.publisher_ready",
            endpoint=self.endpoint,
            replay_endpoint=self.replay_endpoint,
            mode=config.mode,
            profile=config.profile,
            dp_rank=dp_rank,
        )
        if start:
            self.start()

    @classmethod
    def check_config(cls, config: KvEventsConfig, dp_rank: int = 0) -> None:
        """Refuse endpoints this publisher could not open, opening nothing (``schedkit
        validate`` runs it too): ``ArgumentError`` names the config key."""
        check_publisher_endpoints(config, dp_rank)

    @property
    def replay_endpoint(self) -> str | None:
        """The bound replay endpoint, or None without replay."""
        return None if self._replay is None else self._replay.endpoint

    @property
    def queue_depth(self) -> int:
        """Batches accepted but not yet handed to the socket."""
        return len(self._queue)

    @property
    def last_seq(self) -> int:
        """The last seq taken (by a batch or a heartbeat), -1 before the first."""
        return self._next_seq - 1

    def publish(self, batch: EventBatch) -> bool:
        """Queue ``batch`` under the next seq; False (counted in ``dropped``) if the queue is
        full or the publisher is shut down."""
        queue = self._queue
        with self._publish_lock:
            seq = self._next_seq
            self._next_seq = seq + 1
            depth = len(queue)
            if depth >= self._max_queue_size or self._closed:
                self.dropped += 1
                return False
            queue.append((seq, batch))
            self.accepted += 1
        if self._asleep or depth == self._wake_at:
            self._asleep = False
            self._wake()
        return True

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # not held: a wakeup is already pending
            self._wakeup.release()

    def start(self) -> None:
        """Start the threads (done by the constructor unless ``start=False``)."""
        if self._sender is not None or self._closed:
            return
        self._sender = threading.Thread(target=self._send_loop, name="kv-events-send")
        self._sender.daemon = True
        self._sender.start()
        if self._replay is not None:
            self._replay.start()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every batch accepted so far has been handed to the socket."""
        if self._closed:
            return not self._queue
        if self._sender is None:
            self._drain()
            return True
        done = threading.Event()
        self._queue.append((None, done))
        self._wake()
        return done.wait(timeout)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Send everything accepted, then close the sockets (lingering up to ``timeout``
        seconds for queued frames) and stop the threads. Safe to call more than once."""
        with self._shutdown_lock:
            if self._closed:
                return
            self._closed = True
        self._linger_ms = max(0, int(timeout * 1000))
        self._stopping = True
        if self._sender is None:
            self._drain()
            self._pub.close(linger=self._linger_ms)
            stopped = True
        else:
            self._wake()
            self._sender.join(timeout + 1.0)
            stopped = not self._sender.is_alive()
        if self._replay is not None:
            stopped = self._replay.stop(timeout + 1.0) and stopped
        if not stopped:
            log.warning("kv_events.shutdown_timeout", endpoint=self.endpoint, timeout=timeout)
        elif self._own_context:
            self._context.term()  # returns once queued frames are out or linger expired
        # A batch appended by another thread while shutdown began was never sent.
        self.dropped += sum(1 for seq, _ in self._queue if seq is not None)
        self._queue.clear()

    # -- sender thread ----------------------------------------------------------------------

    def _send_loop(self) -> None:
        queue, wakeup = self._queue, self._wakeup
        # Measured on the clock, not in polls: on a loaded machine a poll takes longer
        # than POLL_INTERVAL, and counted polls kept the sender awake well past IDLE_AFTER.
        idle_at = time.monotonic() + IDLE_AFTER
        try:
            while not self._stopping:
                if queue:
                    self._drain()
                    idle_at = time.monotonic() + IDLE_AFTER
                elif time.monotonic() < idle_at:
                    wakeup.acquire(timeout=POLL_INTERVAL)
                else:
                    # publish() sees the flag after its append, so a batch that arrives
                    # between this check and the acquire still wakes us.
                    self._asleep = True
                    if not queue and not self._stopping:
                        wakeup.acquire(timeout=self._heartbeat or -1)
                    self._asleep = False
                    idle_at = time.monotonic() + IDLE_AFTER
                if self._heartbeat and not queue and not self._stopping:
                    self._maybe_heartbeat()
            self._drain()
        except Exception:
            log.exception("kv_events.sender_failed", endpoint=self.endpoint)
        finally:
            self._pub.close(linger=self._linger_ms)

    def _maybe_heartbeat(self) -> None:
        if time.monotonic() - self._last_send < self._heartbeat:
            return
        with self._publish_lock:  # no publish() may take a seq between this one and its send
            if self._queue:
                return
            seq = self._next_seq
            self._next_seq = seq + 1
            self._send(seq, KVEventBatch(time.time(), [], self.dp_rank), heartbeat=True)

    def _drain(self) -> None:
        queue = self._queue
        while queue:
            seq, batch = queue.popleft()
            if seq is None:  # a flush() marker
                batch.set()
            else:
                self._send(seq, batch)

    def _send(self, seq: int, batch: EventBatch, *, heartbeat: bool = False) -> None:
        """Encode, buffer, count (in ``heartbeats`` or ``published``) and send one batch."""
        try:
            if batch.attn_dp_rank is None:
                batch.attn_dp_rank = self.dp_rank
            payload = self._encode(batch)
        except Exception:
            self.encode_errors += 1
            log.exception("kv_events.encode_failed", seq=seq, endpoint=self.endpoint)
            return
        seq_bytes = seq.to_bytes(8, "big")
        # Buffered before it goes out live: a subscriber that drops live frames it cannot
        # trust and then asks for a replay must find every frame it dropped in the ring.
        if self._replay is not None:
            self._replay.add(seq, seq_bytes, payload)
        # Counted before it goes out, so that whoever has received it sees it counted.
        if heartbeat:
            self.heartbeats += 1
        else:
            self.published += 1
        self._pub.send_multipart((self._topic, seq_bytes, payload))
        self._last_send = time.monotonic()
