"""Request receivers: where the scheduler's new requests and control requests come from.

``recv_requests()`` returns what arrived since the last call, without blocking: scheduler
``Req``s and ``ControlRequest``s. ``wait(timeout)`` sleeps until something arrives (the host
loop's sleep-on-idle). ``InprocRequestReceiver`` is a queue filled with ``put``;
``ZmqRequestReceiver`` decodes msgpack messages from a ZeroMQ ROUTER socket.
"""

from __future__ import annotations

import threading
from collections import deque
from functools import partial

import attrs
import msgspec
import structlog
import zmq
from schedkit.components.io_struct import (
    ControlReply,
    ControlReq,
    ControlRequest,
    check_endpoint,
    decode_request,
    encode,
)
from schedkit.components.schedule_batch import Req

from schedkit.component import at_least, component

__all__ = ["ControlRequest", "InprocRequestReceiver", "ZmqRequestReceiver"]

log = structlog.get_logger(__name__)


@component("inproc_request_receiver")
class InprocRequestReceiver:
    """A thread-safe in-process queue of requests.

    ``put`` may be called from any thread; ``recv_requests`` drains the queue in arrival order.
    """

    _queue: deque[Req | ControlRequest] = attrs.field(init=False, factory=deque)
    _arrived: threading.Event = attrs.field(init=False, factory=threading.Event)

    def put(self, item: Req | ControlRequest) -> None:
        """Queue a request or a control request."""
        if not isinstance(item, (Req, ControlRequest)):
            raise TypeError(f"put takes a Req or a ControlRequest, got {type(item).__name__}")
        self._queue.append(item)
        self._arrived.set()

    def recv_requests(self) -> list[Req | ControlRequest]:
        """Everything queued since the last call (an empty list when nothing was)."""
        queue = self._queue
        if not queue:
            return []
        self._arrived.clear()
        items = []
        while queue:
            items.append(queue.popleft())
        return items

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until a request is queued; True if one is."""
        return bool(self._queue) or self._arrived.wait(timeout)

    def close(self) -> None:
        """Drop whatever is still queued."""
        self._queue.clear()


@component("zmq_request_receiver")
class ZmqRequestReceiver:
    """Receives msgpack-encoded ``GenerateReqInput`` and ``ControlReq`` messages on a ROUTER socket.

    Clients connect DEALER (or REQ) sockets to ``endpoint`` and send one message per frame.
    The socket binds a loopback address unless ``allow_remote``; port 0 picks a free port (see
    ``bound_endpoint``). A control request comes with ``reply(...)``, which sends a
    ``ControlReply`` back to the client that asked. Messages that are not valid msgpack, do not
    match the schema or carry invalid values are logged with the problem and skipped
    (``malformed_count`` counts them); ``recv_requests`` never raises and never blocks, and
    takes at most ``max_recv_per_call`` messages per call so that a flood cannot stall a step.
    """

    endpoint: str = "tcp://127.0.0.1:0"
    allow_remote: bool = False
    max_recv_per_call: int = attrs.field(default=4096, validator=at_least(1))
    linger_ms: int = 0
    bound_endpoint: str = attrs.field(init=False, default="")
    malformed_count: int = attrs.field(init=False, default=0)
    _socket: zmq.Socket = attrs.field(init=False, default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        check_endpoint(self.endpoint, bind=True, allow_remote=self.allow_remote)
        socket = zmq.Context.instance().socket(zmq.ROUTER)
        try:
            socket.bind(self.endpoint)
        except zmq.ZMQError as exc:
            socket.close(linger=0)
            raise ValueError(f"cannot bind ROUTER socket to {self.endpoint!r}: {exc}") from None
        self.bound_endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._socket = socket

    def recv_requests(self) -> list[Req | ControlRequest]:
        """The requests that arrived since the last call, decoded; never blocks."""
        socket = self._socket
        items: list[Req | ControlRequest] = []
        if socket.closed:
            return items
        for _ in range(self.max_recv_per_call):
            try:
                if not socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    break
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except zmq.ZMQError as exc:
                log.error("request socket failed", endpoint=self.bound_endpoint, error=str(exc))
                break
            item = self._parse(frames)
            if item is not None:
                items.append(item)
        return items

    def _parse(self, frames: list[bytes]) -> Req | ControlRequest | None:
        # A DEALER client's message arrives as [identity, payload]; a REQ client's as
        # [identity, b"", payload]. The envelope (all but the payload) routes the reply.
        envelope, payload = frames[:-1], frames[-1]
        peer = frames[0].hex()
        if len(frames) not in (2, 3) or (len(frames) == 3 and frames[1]):
            return self._malformed(
                peer, f"expected [identity, payload] frames, got {len(frames)} frames"
            )
        try:
            msg = decode_request(payload)
        except msgspec.DecodeError as exc:
            return self._malformed(peer, f"{exc} (valid messages: GenerateReqInput, ControlReq)")
        if isinstance(msg, ControlReq):
            return ControlRequest(
                type=msg.type, mode=msg.mode, send_reply=partial(self._send_reply, envelope)
            )
        return msg.to_req()

    def _malformed(self, peer: str, problem: str) -> None:
        self.malformed_count += 1
        log.warning("malformed request skipped", problem=problem, peer=peer)
        return None

    def _send_reply(self, envelope: list[bytes], reply: ControlReply) -> None:
        if self._socket.closed:
            log.warning("control reply dropped: socket closed", type=reply.type)
            return
        try:
            self._socket.send_multipart([*envelope, encode(reply)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.warning("control reply dropped", type=reply.type, error=str(exc))

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until a message is readable; True if one is."""
        if self._socket.closed:
            return False
        return bool(self._socket.poll(int(timeout * 1000), zmq.POLLIN))

    def close(self) -> None:
        """Close the socket (pending replies wait at most ``linger_ms``)."""
        if not self._socket.closed:
            self._socket.close(linger=self.linger_ms)
