"""Output senders: where the output streamer's batch messages go.

``InprocOutputCollector`` keeps every message in memory (tests) after a real msgpack round
trip; ``OutputTally`` encodes and counts (runs, benchmarks: flat memory); ``ZmqOutputSender``
pushes the encoded messages to a detokenizer over a ZeroMQ PUSH socket. Each of them
``takes_encoded``: the output streamer may hand it a decode step's message already encoded
(``EncodedTokenIDOutput``, see ``token_wire``), which it sends or counts as is.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import attrs
import zmq

from schedkit.components.io.io_struct import (
    BatchEmbeddingOutput,
    BatchTokenIDOutput,
    check_endpoint,
    decode_output,
    encode,
)
from schedkit.components.io.token_wire import EncodedTokenIDOutput
from schedkit.core.component import ArgumentError, at_least, component
from schedkit.core.schedule_batch import FinishReason

__all__ = ["InprocOutputCollector", "OutputTally", "ZmqOutputSender"]

OutputMessage = BatchTokenIDOutput | BatchEmbeddingOutput | EncodedTokenIDOutput


@component("inproc_output_collector")
class InprocOutputCollector:
    """Collects output messages in process, as a detokenizer would receive them.

    Each message is encoded and decoded again (unless ``roundtrip`` is False), so what is kept
    went through the real wire format. ``outputs[rid]`` concatenates the new tokens of every
    send, ``finished[rid]`` is the finish reason and ``send_counts[rid]`` the number of final
    sends. Anything sent for a rid that already finished (a second final send included) is an
    error: the rid is appended to ``double_finishes``. Without the round trip it takes no
    encoded messages (``takes_encoded``), only objects.
    """

    roundtrip: bool = True
    messages: list[OutputMessage] = attrs.field(init=False, factory=list)
    outputs: dict[str, list[int]] = attrs.field(init=False, factory=dict)
    finished: dict[str, FinishReason] = attrs.field(init=False, factory=dict)
    send_counts: dict[str, int] = attrs.field(init=False, factory=dict)
    double_finishes: list[str] = attrs.field(init=False, factory=list)
    closed: bool = attrs.field(init=False, default=False)

    @property
    def takes_encoded(self) -> bool:
        """True when messages go through the wire format (the round trip is on)."""
        return self.roundtrip

    def send(self, msg: OutputMessage) -> None:
        """Record one batch message."""
        if self.closed:
            raise RuntimeError("send on a closed InprocOutputCollector")
        if type(msg) is EncodedTokenIDOutput:
            msg = decode_output(msg.wire)
        elif self.roundtrip:
            msg = decode_output(encode(msg))
        self.messages.append(msg)
        finished, outputs, send_counts = self.finished, self.outputs, self.send_counts
        token_ids = msg.output_ids if isinstance(msg, BatchTokenIDOutput) else None
        for i, rid in enumerate(msg.rids):
            if rid in finished:
                self.double_finishes.append(rid)
            if token_ids is not None:
                tokens = outputs.get(rid)
                if tokens is None:
                    outputs[rid] = list(token_ids[i])
                else:
                    tokens.extend(token_ids[i])
            reason = msg.finished_reasons[i]
            if reason is not None:
                finished[rid] = reason
                send_counts[rid] = send_counts.get(rid, 0) + 1

    def close(self) -> None:
        """Refuse further sends; what was collected stays readable."""
        self.closed = True


@component("output_tally")
class OutputTally:
    """An output sender for runs and benchmarks: each message is encoded as the wire would
    carry it, then only counted, so memory stays flat however many requests pass through.

    ``messages``, ``output_tokens``, ``finished`` and ``bytes_encoded`` count what was sent;
    a rid sent anything after its final send lands in ``double_finishes``. With ``encode``
    False nothing is encoded (the scheduler's cost alone), and no encoded message is taken.
    """

    encode: bool = True
    messages: int = attrs.field(init=False, default=0)
    output_tokens: int = attrs.field(init=False, default=0)
    finished: int = attrs.field(init=False, default=0)
    bytes_encoded: int = attrs.field(init=False, default=0)
    double_finishes: list[str] = attrs.field(init=False, factory=list)
    closed: bool = attrs.field(init=False, default=False)
    _done: set[str] = attrs.field(init=False, factory=set)
    # The rids column of an encoded message last found to hold no finished rid, and how many
    # rids had finished then.
    _clear_rids: list[str] | None = attrs.field(init=False, default=None, repr=False)
    _clear_at: int = attrs.field(init=False, default=0, repr=False)

    @property
    def takes_encoded(self) -> bool:
        """True when messages are encoded (``encode``)."""
        return self.encode

    def send(self, msg: OutputMessage) -> None:
        """Encode and count one batch message."""
        if self.closed:
            raise RuntimeError("send on a closed OutputTally")
        if type(msg) is EncodedTokenIDOutput:
            self._count_encoded(msg)
            return
        if self.encode:
            self.bytes_encoded += len(encode(msg))
        self.messages += 1
        done, rids, reasons = self._done, msg.rids, msg.finished_reasons
        if isinstance(msg, BatchTokenIDOutput):
            self.output_tokens += sum(map(len, msg.output_ids))
        if not done.isdisjoint(rids):
            self.double_finishes += [rid for rid in rids if rid in done]
        if reasons.count(None) != len(reasons):
            finished = [
                rid for rid, reason in zip(rids, reasons, strict=True) if reason is not None
            ]
            done.update(finished)
            self.finished += len(finished)

    def _count_encoded(self, msg: EncodedTokenIDOutput) -> None:
        self.bytes_encoded += len(msg.wire)
        self.messages += 1
        self.output_tokens += msg.output_tokens
        rids, done = msg.rids, self._done
        # The same rids column (never changed) found clear since nothing finished: clear still.
        if rids is not self._clear_rids or len(done) != self._clear_at:
            if done.isdisjoint(rids):
                self._clear_rids, self._clear_at = rids, len(done)
            else:
                self.double_finishes += [rid for rid in rids if rid in done]
        if msg.finished_rids:
            done.update(msg.finished_rids)
            self.finished += len(msg.finished_rids)

    @property
    def takes_decode_runs(self) -> bool:
        """Whether ``send_decode_run`` counts runs of messages (nothing is encoded)."""
        return not self.encode

    def send_decode_run(self, rids: list[str], steps: int) -> None:
        """Count ``steps`` messages each carrying one new token of each request of ``rids``,
        none finished: what as many ``send`` calls count (without ``encode`` only)."""
        if self.closed:
            raise RuntimeError("send on a closed OutputTally")
        if self.encode:
            raise RuntimeError("send_decode_run counts runs only without encode")
        self.messages += steps
        self.output_tokens += len(rids) * steps
        if not self._done.isdisjoint(rids):
            self.double_finishes += [rid for rid in rids if rid in self._done] * steps

    def close(self) -> None:
        """Refuse further sends; the counts stay readable."""
        self.closed = True


@component("zmq_output_sender")
class ZmqOutputSender:
    """Pushes msgpack-encoded output messages on a ZeroMQ PUSH socket.

    ``mode: connect`` (the default) connects to a detokenizer that binds ``endpoint``;
    ``mode: bind`` binds it (loopback only unless ``allow_remote``; port 0 picks a free port,
    see ``bound_endpoint``). ``send`` blocks while the socket's queue holds ``sndhwm`` messages
    (0, the default, sets no limit) or, in bind mode, until a peer connects, like SGLang's
    detokenizer socket.
    ``close()`` waits at most ``linger_ms`` for queued messages to leave.
    """

    endpoint: str
    mode: Literal["connect", "bind"] = "connect"
    allow_remote: bool = False
    linger_ms: int = attrs.field(default=1000, validator=at_least(0))
    sndhwm: int = attrs.field(default=0, validator=at_least(0))
    bound_endpoint: str = attrs.field(init=False, default="")
    _socket: zmq.Socket = attrs.field(init=False, default=None, repr=False)
    takes_encoded: ClassVar[bool] = True

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too)."""
        if args.mode not in ("connect", "bind"):
            raise ArgumentError("mode", f"mode must be 'connect' or 'bind', got {args.mode!r}")
        try:
            check_endpoint(args.endpoint, bind=args.mode == "bind", allow_remote=args.allow_remote)
        except ValueError as exc:
            raise ArgumentError("endpoint", str(exc)) from None

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)
        socket = zmq.Context.instance().socket(zmq.PUSH)
        socket.setsockopt(zmq.SNDHWM, self.sndhwm)
        try:
            if self.mode == "bind":
                socket.bind(self.endpoint)
                self.bound_endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                socket.connect(self.endpoint)
                self.bound_endpoint = self.endpoint
        except zmq.ZMQError as exc:
            socket.close(linger=0)
            raise ValueError(
                f"cannot {self.mode} PUSH socket to {self.endpoint!r}: {exc}"
            ) from None
        self._socket = socket

    def send(self, msg: OutputMessage) -> None:
        """Encode and push one batch message."""
        if type(msg) is EncodedTokenIDOutput:
            self._socket.send(msg.wire)
        else:
            self._socket.send(encode(msg))

    def close(self) -> None:
        """Close the socket, waiting at most ``linger_ms`` for pending messages."""
        if not self._socket.closed:
            self._socket.close(linger=self.linger_ms)
