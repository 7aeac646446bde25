"""A subscriber's side of a publisher's replay socket: one DEALER, the requests sent on it
(an epoch question or a replay from a seq) and the replies collected for each, answered in
the order they were sent.

Everything a publisher can make it hold is bounded: each answer by ``ReplayBounds`` (batches,
bytes and seconds per request; an answer that goes past them is cut, the rest never read), the
socket by its ZMQ_MAXMSGSIZE and a receive queue sized in bytes, and the work of one read by a
deadline. The subscriber decides what the answers mean (``schedkit.kv_events.subscriber``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import attrs
import zmq

from schedkit.kv_events.bad_input import BadInput
from schedkit.kv_events.replay import EPOCH_REQUEST

__all__ = [
    "CHECK",
    "GAP",
    "JUDGE",
    "LEARN",
    "RECONNECT",
    "REPLAY",
    "ReplayBounds",
    "ReplayClient",
    "ReplayRequest",
    "held_bytes",
]

# What a request on the replay socket is for.
LEARN = "learn"  # the epoch, before the first batch is judged
JUDGE = "judge"  # the epoch, because the live seq went back: a restart or a duplicate?
GAP = "gap"  # the epoch, because of a gap: a restart whose seqs ran past the old ones?
CHECK = "check"  # the epoch, every epoch_check_interval; live batches flow meanwhile
RECONNECT = "reconnect"  # the epoch, because the live socket connected again
REPLAY = "replay"  # missed batches

_END_SEQ = -1
INT_BYTES = 40  # a decoded int: the object and the list's pointer to it


def held_bytes(kept: bytes, decoded: object) -> int:
    """What a decoded reply holds: its kept payload and ``INT_BYTES`` per hash and token id."""
    ints = 0
    for event in getattr(decoded, "events", ()):
        ints += len(getattr(event, "block_hashes", ())) + len(getattr(event, "token_ids", ()))
    return len(kept) + INT_BYTES * ints


@attrs.frozen(kw_only=True)
class ReplayBounds:
    """What one answer on the replay socket may cost the subscriber: ``max_batches`` replies,
    ``max_bytes`` held and ``max_seconds`` from the request, however fast they come. The
    replies are held decoded until the answer ends; what they hold is counted as the payloads
    kept plus ``INT_BYTES`` per decoded hash and token id (a token id costs a router nothing:
    it drops them, ``keep_tokens=False``). A publisher's whole ring (``buffer_steps``, 10,000
    batches by default) of batches of up to ~300 tokens fits."""

    max_batches: int = attrs.field(default=20_000, validator=attrs.validators.ge(1))
    max_bytes: int = attrs.field(default=128 << 20, validator=attrs.validators.ge(1))
    max_seconds: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))


class ReplayRequest:
    """A request sent on the replay socket and the replies collected for it so far."""

    __slots__ = (
        "answer",
        "answered",
        "cut",
        "cutoff",
        "deadline",
        "frame",
        "held_bytes",
        "kind",
        "payload_bytes",
        "received",
        "replies",
        "restart",
        "start",
    )

    def __init__(
        self, kind: str, deadline: float, cutoff: float, start: int, frame: object
    ) -> None:
        self.kind = kind
        self.deadline = deadline  # given up unless a reply comes by then
        self.cutoff = cutoff  # cut when its answer has not ended by then
        self.start = start  # a replay's first seq
        self.frame = frame  # the live frame whose handling waits for the answer, if any
        # (seq, payload or b"" when not kept, the batch or why it did not decode)
        self.replies: list[tuple[int, bytes, object]] = []
        self.payload_bytes = 0
        self.held_bytes = 0  # what the kept replies hold (see ReplayBounds)
        self.received = 0  # replies read, kept or not
        self.answered = False  # the end marker arrived (or the answer was cut)
        self.cut = False  # the answer went past the bounds; the rest was not read
        self.answer = b""  # the end marker's payload
        self.restart: int | None = None  # a new publisher's replay: the old one's last seq

    @property
    def holds(self) -> bool:
        """Live frames wait until this request is answered."""
        return self.kind != CHECK


class ReplayClient:
    """The DEALER on ``endpoint`` and the requests in flight on it, oldest first.

    ``sockets`` is the owner's list of open sockets (for closing); the DEALER in use is kept
    in it. ``timeout`` is how long a request may go without a reply before it is given up.
    A replay's replies are decoded with ``decode`` as they are read, so that the work is
    spread over the reads (each bounded by its deadline); their payloads are kept only with
    ``keep_payloads``.
    """

    def __init__(
        self,
        context: zmq.Context,
        endpoint: str,
        sockets: list[zmq.Socket],
        bad: BadInput,
        *,
        timeout: float,
        bounds: ReplayBounds,
        max_message_bytes: int,
        hwm: int,
        decode: Callable[[bytes], object],
        keep_payloads: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.requests: deque[ReplayRequest] = deque()
        self.holding = 0  # requests in flight that live frames wait for
        self.replies_cut = 0
        self._context = context
        self._sockets = sockets
        self._bad = bad
        self._timeout = timeout
        self._bounds = bounds
        self._max_message_bytes = max_message_bytes
        self._hwm = hwm
        self._decode = decode
        self._keep_payloads = keep_payloads
        self._dealer: zmq.Socket | None = None
        self.new_identity()

    def _report(self, kind: str, **details: object) -> None:
        self._bad(kind, replay_endpoint=self.endpoint, **details)

    @property
    def socket(self) -> zmq.Socket:
        """The DEALER in use (to poll on)."""
        return self._dealer

    def new_identity(self) -> None:
        """A DEALER under a new identity: replies to earlier requests cannot reach it."""
        if self._dealer is not None:
            self._sockets.remove(self._dealer)
            self._dealer.close(linger=0)
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self._max_message_bytes)
        # The publisher queues the rest of an answer on its side while this queue is full.
        dealer.setsockopt(zmq.RCVHWM, self._hwm)
        dealer.connect(self.endpoint)
        self._dealer = dealer
        self._sockets.append(dealer)

    def ask(self, kind: str, *, start: int = 0, frame: object = None) -> ReplayRequest:
        """Send a request (a replay from ``start``, or the epoch); its answer is collected by
        later ``read`` calls."""
        now = time.monotonic()
        request = ReplayRequest(
            kind, now + self._timeout, now + self._bounds.max_seconds, start, frame
        )
        self.requests.append(request)
        self.holding += request.holds
        message = start.to_bytes(8, "big") if kind == REPLAY else EPOCH_REQUEST
        try:
            self._dealer.send_multipart((b"", message), zmq.NOBLOCK)
        except zmq.Again:  # its queue is full: it will time out like an unanswered one
            self._report("request_not_sent", request=kind)
        return request

    def pop(self) -> ReplayRequest:
        """Take the oldest request off the queue (answered or given up on)."""
        request = self.requests.popleft()
        self.holding -= request.holds
        return request

    def give_up(self) -> list[ReplayRequest]:
        """Take every request off the queue under a new identity, so that no late reply to
        any of them is read; returns them, oldest first."""
        self.new_identity()
        dropped = list(self.requests)
        self.requests.clear()
        self.holding = 0
        return dropped

    def overdue(self, request: ReplayRequest, now: float) -> str | None:
        """Why an unanswered ``request`` is over: "timeout" (no reply for ``timeout``
        seconds), "cut" (its answer ran past ``max_seconds``), or None."""
        if now >= request.cutoff:
            return "cut"
        return "timeout" if now >= request.deadline else None

    def cut(self, request: ReplayRequest, why: str) -> None:
        """Stop reading ``request``'s answer: what came so far stands, the rest is lost."""
        request.answered = request.cut = True
        self.replies_cut += 1
        self._report(
            "replay_cut",
            request=request.kind,
            why=why,
            batches=request.received,
            payload_bytes=request.payload_bytes,
            held_bytes=request.held_bytes,
        )

    def read(self, until: float) -> bool:
        """Read the replies waiting, each into the oldest unanswered request, until none is
        waiting or ``until`` (monotonic) passes; True when an answer was cut at its bounds
        (the caller then gives up the requests behind it with ``give_up``)."""
        bounds = self._bounds
        while self.requests:
            try:
                frames = self._dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return False
            # ["", topic, seq, payload] (vLLM, schedkit) or ["", seq, payload] (SGLang)
            seq = -2
            if frames[0] == b"" and len(frames) in (3, 4) and len(frames[-2]) == 8:
                seq = int.from_bytes(frames[-2], "big", signed=True)
            if seq < _END_SEQ:
                self._report("bad_replay_reply", frames=[len(f) for f in frames[:8]])
            else:
                request = next((r for r in self.requests if not r.answered), None)
                if request is None:
                    self._report("unexpected_replay_reply")
                    continue
                now = time.monotonic()
                request.deadline = now + self._timeout  # it is making progress
                if seq == _END_SEQ:
                    request.answered = True
                    request.answer = frames[-1]
                else:
                    payload = frames[-1]
                    request.received += 1
                    request.payload_bytes += len(payload)
                    if request.kind != REPLAY:
                        # The epoch is the end marker alone (SGLang's and vLLM's publishers
                        # read the question as a seq past their ring and send just that).
                        self.cut(request, "batches in answer to an epoch question")
                        return True
                    kept = payload if self._keep_payloads else b""
                    decoded = self._decode(payload)
                    request.replies.append((seq, kept, decoded))
                    request.held_bytes += held_bytes(kept, decoded)
                    if request.received > bounds.max_batches:
                        self.cut(request, f"more than {bounds.max_batches} batches")
                        return True
                    if request.held_bytes > bounds.max_bytes:
                        self.cut(request, f"holding more than {bounds.max_bytes} bytes")
                        return True
                    if now >= request.cutoff:
                        self.cut(request, f"not ended after {bounds.max_seconds} s")
                        return True
            if time.monotonic() >= until:
                return False
        return False
