"""A KV-event subscriber: decodes one publisher's stream in seq order, recovers gaps through
the publisher's replay socket, and reports what it could not recover as typed notices.

Four layers, one per concern: ``KvEventSubscriber`` here keeps the subscriber's contract,
``poll`` and its lifetime; ``SubscriberSockets`` (``subscriber_sockets``) the sockets, the
live reading and reconnects; ``ReplayExchange`` (``replay_exchange``) the questions a live
frame raises on the replay socket and what the answers do; ``StreamSequencing``
(``sequencing``) the state they move (last seq, live seq, epoch) and the notices.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator

import structlog
import zmq

from schedkit.kv_events.bad_input import BadInput
from schedkit.kv_events.notices import (
    GapDetected,
    GapFilled,
    HistoryLost,
    Notice,
    PublisherRestarted,
)
from schedkit.kv_events.replay_client import ReplayBounds
from schedkit.kv_events.sequencing import LiveFrame, payload_decoder
from schedkit.kv_events.structs import MAX_BATCH_BYTES, KVEventBatch, get_profile
from schedkit.kv_events.subscriber_sockets import SubscriberSockets

__all__ = [
    "GapDetected",
    "GapFilled",
    "HistoryLost",
    "KvEventSubscriber",
    "Notice",
    "PublisherRestarted",
    "ReplayBounds",
]

log = structlog.get_logger(__name__)

# The work one poll() call does before it returns, past its timeout: reading a flood of live
# frames or replies stops here and goes on in the next call.
_WORK_SECONDS = 0.005
# Per socket: what libzmq may hold of what the publisher sent and the subscriber has not read
# yet; the receive queue holds queue_bytes // max_message_bytes messages (at least 1).
QUEUE_BYTES = 32 << 20


class KvEventSubscriber(SubscriberSockets):
    """Subscribes to one publisher (one DP rank) and yields ``(seq, KVEventBatch)`` in seq
    order without duplicates.

    A gap in the live stream triggers a replay request (DEALER) from the last applied seq + 1;
    a fresh subscriber whose first seq is above 0 replays from 0. Replies may carry the topic
    frame (``["", topic, seq, payload]``) or not (``["", seq, payload]``). Every profile is
    decoded (with ``strict``, only ``profile``, as its engine declares it; other payloads
    count in ``decode_errors``). Nothing a publisher sends raises out of ``poll``: a bad
    frame or payload (not msgpack, not a batch, over ``MAX_BATCH_BYTES``, nested too deep) is
    counted by kind in ``bad_input`` and the first of each kind logged with the endpoint.
    Notices go to ``on_notice`` (default: appended to ``notices``).

    What a publisher can make it hold is bounded: each socket refuses a message over
    ``max_message_bytes`` (ZMQ_MAXMSGSIZE: libzmq drops the connection) and queues at most
    ``queue_bytes // max_message_bytes`` unread messages (RCVHWM; ``hwm`` overrides it), and
    each replay answer is bounded by ``replay_bounds`` (batches, bytes, seconds): one that
    goes past them is cut, what it delivered is applied and the rest reported as
    ``HistoryLost(cut=True)``. One ``poll`` call does at most ~5 ms of reading past its
    timeout, so ``poll(0)`` returns promptly whatever floods in (a replay's replies are
    decoded as they are read). ``keep_tokens=False`` delivers every ``BlockStored`` with
    empty ``token_ids`` (a router's index reads only the hashes).

    ``poll`` never waits longer than its timeout: a live frame whose handling needs the
    replay socket (its epoch, missed batches) waits, with the frames behind it queued in the
    socket, until the answers are in, read by this call if they come in time or by a later
    one; then it is handled at once. So a dead publisher costs ``poll(0)`` nothing. A request
    unanswered for ``replay_timeout`` seconds counts as not answered (the frame is handled
    without it); the next one goes out under a new identity.

    A restarted publisher is noticed when its seq goes back, and, with a schedkit publisher's
    replay socket, also when its epoch changes. The epoch is asked for when the subscriber is
    created, so that it is known before the first batch is judged; then whenever the live
    socket connects again (before reading on), on every gap, when the seq goes back, and
    every ``epoch_check_interval`` seconds, so a new publisher whose seqs run past the old
    ones (or continue them exactly) is still told apart. The subscriber then reports
    ``PublisherRestarted`` (if it had delivered anything) and replays the new publisher from
    seq 0, its ``AllBlocksCleared`` included, right after the notice. Unless the seq went
    back, it first discards the live frames queued so far, all of them, over as many ``poll``
    calls as that takes, before it reads anything live: the old publisher's tail may be
    among them and nothing tells them apart; what the new one sent among them is replayed.
    Unless the restart was seen when the live socket connected again, what comes in live
    is discarded until it does (it does once the old connection is read to its end: the
    rest of the tail may still be on it), for at most ``replay_timeout`` seconds.
    Replay answers are matched to requests by their order, so an epoch check in flight when
    the live socket connects again is given up under a new identity. After a reconnect to
    the same publisher it replays what went out while the live socket was away; otherwise
    every batch, an empty heartbeat too, shows a missed tail as a gap.

    Close it (or use it as a context manager). One that is garbage-collected open closes its
    sockets without lingering and warns (``ResourceWarning``); finalisation never blocks,
    even inside a reference cycle. Without ``context`` it uses the process-wide
    ``zmq.Context.instance()``, which it never terminates.
    """

    _keeps_payloads = False  # replayed payloads kept after decoding (a checker reads them)

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        profile: str = "sglang",
        *,
        context: zmq.Context | None = None,
        on_notice: Callable[[Notice], None] | None = None,
        hwm: int | None = None,
        max_message_bytes: int = MAX_BATCH_BYTES,
        queue_bytes: int = QUEUE_BYTES,
        replay_timeout: float = 5.0,
        replay_bounds: ReplayBounds | None = None,
        poll_interval: float = 0.05,
        epoch_check_interval: float = 2.0,
        strict: bool = False,
        keep_tokens: bool = True,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.notices: list[Notice] = []
        self.bad_input = BadInput(endpoint, "kv_events.bad_input", log)
        wire = get_profile(profile)
        # Not a bound method: the replay client holds it, and must not hold the subscriber.
        self._decode_payload = payload_decoder(
            wire.strict_decode if strict else wire.decode, keep_tokens
        )
        self._epoch_told: bool | None = None  # whether the replay socket tells an epoch
        self._epoch_interval = epoch_check_interval
        self._epoch_checked = time.monotonic()
        self._notice = self.notices.append if on_notice is None else on_notice
        self._poll_ms = max(1, int(poll_interval * 1000))
        self._work_until = 0.0  # when the current poll() call stops reading
        self._init_sequencing()
        self._frame: LiveFrame | None = None  # the live frame whose answers are awaited
        self._closed = False
        self._iterating: int | None = None
        self._lock = threading.Lock()
        self._context = zmq.Context.instance() if context is None else context
        if hwm is None:
            hwm = max(1, queue_bytes // max_message_bytes)
        self._open_sockets(
            topic,
            hwm=hwm,
            max_message_bytes=max_message_bytes,
            replay_timeout=replay_timeout,
            replay_bounds=replay_bounds,
        )

    @property
    def decode_errors(self) -> int:
        """Payloads that did not decode as a batch (of ``profile`` only, when ``strict``)."""
        return self.bad_input["payload"]

    @property
    def frame_errors(self) -> int:
        """Live messages not framed as ``[topic, 8-byte seq, payload]``."""
        return self.bad_input["live_frames"]

    @property
    def replays_cut(self) -> int:
        """Replay answers cut at ``replay_bounds``."""
        return 0 if self._replay is None else self._replay.replies_cut

    def poll(self, timeout_ms: int = 0) -> list[tuple[int, KVEventBatch]]:
        """Wait up to ``timeout_ms`` for batches and return the ones now due, in order
        (replayed batches included); never blocks longer (reading a flood stops ~5 ms past
        it). Returns [] once closed."""
        out: list[tuple[int, KVEventBatch]] = []
        if self._closed:
            return out
        now = time.monotonic()
        deadline = now + max(0, timeout_ms) / 1000
        self._work_until = max(deadline, now + _WORK_SECONDS)
        replay = self._replay
        while True:
            if not self._take_answers(out):
                return out  # a restart is reported at the start of the next call
            holding = replay is not None and replay.holding
            if not holding:
                self._read_live(out)
                holding = replay is not None and replay.holding
            now = time.monotonic()
            wait = deadline - now
            if wait <= 0 or (out and not holding):
                return out
            requests = None if replay is None else replay.requests
            if requests:
                first = requests[0]
                wait = min(wait, first.deadline - now, first.cutoff - now)
            elif self._epoch_check_due(now):
                continue  # _take_answers sends it
            elif replay is not None and self._live_last is not None:
                wait = min(wait, self._epoch_checked + self._epoch_interval - now)
            items = [(replay.socket, zmq.POLLIN)] if requests else []
            if not holding:
                items.append((self._sub, zmq.POLLIN))
            zmq.zmq_poll(items, max(0, math.ceil(wait * 1000)))
            self._work_until = max(self._work_until, time.monotonic() + _WORK_SECONDS)

    def __iter__(self) -> Iterator[tuple[int, KVEventBatch]]:
        return self.iter_batches()

    def iter_batches(self, idle_timeout: float | None = None) -> Iterator[tuple[int, KVEventBatch]]:
        """Yield batches until ``close()`` (from any thread) or, if given, until
        ``idle_timeout`` seconds pass without a new batch."""
        with self._lock:
            self._iterating = threading.get_ident()
        try:
            deadline = None if idle_timeout is None else time.monotonic() + idle_timeout
            while not self._closed:
                items = self.poll(self._poll_ms)
                for item in items:
                    if self._closed:
                        return
                    yield item
                if items:
                    if idle_timeout is not None:
                        deadline = time.monotonic() + idle_timeout
                elif deadline is not None and time.monotonic() >= deadline:
                    return
        finally:
            with self._lock:
                self._iterating = None
            if self._closed:
                self._close_sockets()

    def close(self) -> None:
        """Close the sockets (without lingering); safe to call more than once. Called from
        another thread while that thread iterates, it only stops the iteration, which then
        closes the sockets."""
        with self._lock:
            self._closed = True
            if self._iterating is not None and self._iterating != threading.get_ident():
                return
        self._close_sockets()

    def __enter__(self) -> KvEventSubscriber:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
