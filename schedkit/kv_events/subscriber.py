"""A KV-event subscriber: decodes one publisher's stream in seq order, recovers gaps through
the publisher's replay socket, and reports what it could not recover as typed notices.


(Longer than 300 lines: the live path, replay and restart detection all update one
sequencing state.)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator

import attrs
import msgspec
import structlog
import zmq

from schedkit.kv_events.replay import EPOCH_REQUEST
from schedkit.kv_events.structs import KVEventBatch, get_profile

__all__ = [
    "GapDetected",
    "GapFilled",
    "HistoryLost",
    "KvEventSubscriber",
    "Notice",
    "PublisherRestarted",
]

log = structlog.get_logger(__name__)

_MAX_READ = 4096  # live messages handled per poll() call


@attrs.frozen
class GapDetected:
    """Live seq ``received`` arrived while ``expected`` was due; a replay is being asked for."""

    expected: int
    received: int


@attrs.frozen
class GapFilled:
    """The replay delivered every missing seq from ``start`` to ``end`` inclusive."""

    start: int
    end: int


@attrs.frozen
class HistoryLost:
    """Batches from ``expected`` on cannot be recovered; state built so far is incomplete.

    ``replay_start`` is the first seq the replay offered, or None when there was no replay
    or it had nothing. A consumer should clear what it built from this stream and go on.
    """

    expected: int
    replay_start: int | None


@attrs.frozen
class PublisherRestarted:
    """A new publisher took over after ``last_seq``: its seq went back (``reason`` "seq",
    ``new_seq`` the seq received), or its replay socket names another epoch (``reason``
    "epoch", ``new_seq`` the live seq at hand when it was noticed). What was built from the
    old publisher is void; start over."""

    last_seq: int
    new_seq: int
    reason: str = "seq"


Notice = GapDetected | GapFilled | HistoryLost | PublisherRestarted


class KvEventSubscriber:
    """Subscribes to one publisher (one DP rank) and yields ``(seq, KVEventBatch)`` in seq
    order without duplicates.

    A gap in the live stream triggers a replay request (DEALER) from the last applied seq + 1;
    a fresh subscriber whose first seq is above 0 replays from 0. Replies may carry the topic
    frame (``["", topic, seq, payload]``) or not (``["", seq, payload]``). Every profile is
    decoded (with ``strict``, only ``profile``, as its engine declares it; other payloads
    count in ``decode_errors``). Notices go to ``on_notice`` (default: appended to
    ``notices``).

    A restarted publisher is noticed when its seq goes back, and, with a schedkit publisher's
    replay socket, also when its epoch changes: checked on every gap and every
    ``epoch_check_interval`` seconds, so a new publisher whose seqs run past the old ones (or
    continue them exactly) is still told apart; the subscriber then replays the new one from
    seq 0, its ``AllBlocksCleared`` included. Every batch, an empty heartbeat too, shows a
    missed tail as a gap.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        profile: str = "sglang",
        *,
        context: zmq.Context | None = None,
        on_notice: Callable[[Notice], None] | None = None,
        hwm: int = 100000,
        replay_timeout: float = 5.0,
        poll_interval: float = 0.05,
        epoch_check_interval: float = 2.0,
        strict: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.notices: list[Notice] = []
        self.decode_errors = 0
        self.frame_errors = 0
        wire = get_profile(profile)
        self._decode = wire.strict_decode if strict else wire.decode
        self._epoch: bytes | None = None
        self._epoch_interval = epoch_check_interval
        self._epoch_checked = time.monotonic()
        self._notice = self.notices.append if on_notice is None else on_notice
        self._replay_timeout = replay_timeout
        self._poll_ms = max(1, int(poll_interval * 1000))
        self._last: int | None = None
        self._live_last: int | None = None
        self._closed = False
        self._sockets_open = True
        self._iterating: int | None = None
        self._lock = threading.Lock()
        self._own_context = context is None
        self._context = zmq.Context() if context is None else context
        self._sub = self._context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RCVHWM, hwm)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._dealer = None
        try:
            self._sub.connect(endpoint)
            if replay_endpoint is not None:
                self._dealer = self._new_dealer()
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ValueError(
                f"KV-event subscriber cannot connect to {endpoint!r} / {replay_endpoint!r}: "
                f"{exc.strerror}"
            ) from exc

    @property
    def last_seq(self) -> int | None:
        """The last seq applied (None before the first batch or after a restart)."""
        return self._last

    def poll(self, timeout_ms: int = 0) -> list[tuple[int, KVEventBatch]]:
        """Wait up to ``timeout_ms`` for live batches and return the ones now due, in order
        (replayed batches included). Returns [] once closed."""
        out: list[tuple[int, KVEventBatch]] = []
        if self._closed:
            return out
        if (
            self._dealer is not None
            and self._last is not None
            and time.monotonic() - self._epoch_checked >= self._epoch_interval
        ):
            self._check_epoch(self._last, out)
        if not self._sub.poll(timeout_ms):
            return out
        sub = self._sub
        for _ in range(_MAX_READ):
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 3 or len(frames[1]) != 8:
                self.frame_errors += 1
                log.warning("kv_events.bad_live_frames", frames=[len(f) for f in frames[:8]])
                continue
            self._on_live(int.from_bytes(frames[1], "big"), frames[2], out)
        return out

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
        """Close the sockets; safe to call more than once. Called from another thread while
        that thread iterates, it only stops the iteration, which then closes the sockets."""
        with self._lock:
            self._closed = True
            if self._iterating is not None and self._iterating != threading.get_ident():
                return
        self._close_sockets()

    def __enter__(self) -> KvEventSubscriber:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _close_sockets(self) -> None:
        with self._lock:
            if not self._sockets_open:
                return
            self._sockets_open = False
        self._sub.close(linger=0)
        if self._dealer is not None:
            self._dealer.close(linger=0)
        if self._own_context:
            self._context.term()

    # -- sequencing -----------------------------------------------------------------------

    def _on_live(self, seq: int, payload: bytes, out: list) -> None:
        live_last = self._live_last
        if live_last is not None and seq <= live_last:
            if self._same_epoch():  # a duplicate or a late, reordered batch: seen already
                if self._last is not None and seq <= self._last:
                    return
            else:
                last = self._last if self._last is not None else live_last
                self._notice(PublisherRestarted(last, seq))
                self._last = None
                self._live_last = seq
        else:
            self._live_last = seq
            if self._dealer is not None and (self._epoch is None or seq != live_last + 1):
                self._check_epoch(seq, out)
        last = self._last
        if last is not None and seq <= last:  # already delivered by a replay
            return
        expected = 0 if last is None else last + 1
        if seq != expected:
            if self._dealer is None:
                self._notice(HistoryLost(expected, None))
            else:
                if last is not None:
                    self._notice(GapDetected(expected, seq))
                self._replay(expected, seq, out)
                if self._last is not None and seq <= self._last:
                    return
        self._apply(seq, payload, out)

    def _same_epoch(self) -> bool:
        """True when the replay socket names the epoch seen so far (known, and unchanged);
        a seq that goes back is then no restart. Without that knowledge it is one."""
        if self._dealer is None or self._epoch is None:
            return False
        epoch = self._query_epoch()
        if epoch is None or epoch != self._epoch:
            self._epoch = epoch
            return False
        return True

    def _check_epoch(self, seq: int, out: list) -> None:
        """Ask the replay socket for the publisher's epoch; on a new one, report the restart
        and replay the new publisher from seq 0."""
        epoch = self._query_epoch()
        if epoch is None:
            return
        if self._epoch is not None and epoch != self._epoch and self._last is not None:
            self._notice(PublisherRestarted(self._last, seq, "epoch"))
            self._last = None
            self._epoch = epoch
            self._replay(0, 0, out)
            return
        self._epoch = epoch

    def _replay(self, expected: int, received: int, out: list) -> None:
        """Ask for ``expected`` onwards and apply the replies; report what stayed missing."""
        replies = self._request_replay(expected)
        lost = False
        for seq, payload in replies:
            if self._last is not None and seq <= self._last:
                continue
            due = expected if self._last is None else self._last + 1
            if seq != due:
                self._notice(HistoryLost(due, seq))
                lost = True
            self._apply(seq, payload, out)
        if self._last is None or self._last + 1 < received:
            due = expected if self._last is None else self._last + 1
            self._notice(HistoryLost(due, None))
        elif not lost and received > expected:
            self._notice(GapFilled(expected, received - 1))

    def _new_dealer(self) -> zmq.Socket:
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        return dealer

    def _query_epoch(self) -> bytes | None:
        """The publisher's epoch, or None when its replay socket does not tell (an engine's
        own publisher) or does not answer."""
        self._epoch_checked = time.monotonic()
        end: list[bytes] = []
        self._exchange(EPOCH_REQUEST, end)
        return end[0] if end and end[0] else None

    def _request_replay(self, start: int) -> list[tuple[int, bytes]]:
        return self._exchange(start.to_bytes(8, "big"), [])

    def _exchange(self, request: bytes, end: list[bytes]) -> list[tuple[int, bytes]]:
        """Send one request on the replay socket and collect the replies up to the end
        marker, whose payload goes into ``end``."""
        dealer = self._dealer
        dealer.send_multipart((b"", request))
        replies = []
        deadline = time.monotonic() + self._replay_timeout
        while True:
            remaining_ms = math.ceil((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not dealer.poll(remaining_ms):
                log.warning(
                    "kv_events.replay_timeout",
                    endpoint=self.replay_endpoint,
                    request=request.hex(),
                    received=len(replies),
                )
                # A new identity: late replies to this request cannot reach the next one.
                dealer.close()
                self._dealer = self._new_dealer()
                return replies
            frames = dealer.recv_multipart()
            # ["", topic, seq, payload] (vLLM, schedkit) or ["", seq, payload] (SGLang)
            if frames[0] != b"" or len(frames) not in (3, 4) or len(frames[-2]) != 8:
                log.warning("kv_events.bad_replay_reply", frames=[len(f) for f in frames])
                continue
            seq = int.from_bytes(frames[-2], "big", signed=True)
            if seq == -1:
                end.append(frames[-1])
                return replies
            replies.append((seq, frames[-1]))

    def _apply(self, seq: int, payload: bytes, out: list) -> None:
        self._last = seq
        try:
            out.append((seq, self._decode(payload)))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.decode_errors += 1
            log.error("kv_events.decode_failed", seq=seq, error=str(exc))
