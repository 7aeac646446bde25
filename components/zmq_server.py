"""The scheduler's network edge: one ZeroMQ ROUTER socket on which clients send requests and
control messages and get back their own outputs, replies and refusals.

Wire protocol (a client connects a DEALER socket; every message is one msgpack frame, see
``schedkit.components.io_struct``):

- client -> server: ``GenerateReqInput`` or ``ControlReq`` (``pause``, ``continue``, ``flush``,
  ``get_loads``, ``abort`` of one of the client's own rids);
- server -> client: ``BatchTokenIDOutput`` / ``BatchEmbeddingOutput`` holding only the
  client's own requests, ``ControlReply``, and ``ErrorReply`` for anything refused (not
  msgpack, not a known message, a bad field, a rid already in flight), naming what is wrong.

Sends never block the scheduler: each client has a queue of ``max_queued_per_client``
messages; a client whose queue is full (too slow) or that is gone has its requests aborted
(their KV freed) and is counted in ``clients_dropped``. Outputs of requests that no client
sent (submitted in process, or whose client was dropped) have nowhere to go: they are counted
in ``unrouted_outputs`` and the first is logged. Use it in a wiring as both the scheduler's
``request_receiver`` and the output streamer's ``sender``.
"""

from __future__ import annotations

from functools import partial

import attrs
import msgspec
import structlog
import zmq
from schedkit.components.io_struct import (
    BatchEmbeddingOutput,
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    ControlRequest,
    ErrorReply,
    check_endpoint,
    decode_request,
    encode,
)
from schedkit.components.schedule_batch import Req

from schedkit.component import at_least, component

__all__ = ["ZmqServer"]

log = structlog.get_logger(__name__)

OutputMessage = BatchTokenIDOutput | BatchEmbeddingOutput
MAX_MESSAGE_BYTES = 32 << 20


@component("zmq_server")
class ZmqServer:
    """Requests in and each client's own outputs out, on one ROUTER socket; see the module
    docstring. Binds a loopback address unless ``allow_remote``; port 0 picks a free port
    (``bound_endpoint``)."""

    endpoint: str = "tcp://127.0.0.1:0"
    allow_remote: bool = False
    max_recv_per_call: int = attrs.field(default=4096, validator=at_least(1))
    max_queued_per_client: int = attrs.field(default=1000, validator=at_least(1))
    linger_ms: int = 0
    bound_endpoint: str = attrs.field(init=False, default="")
    malformed_count: int = attrs.field(init=False, default=0)
    clients_dropped: int = attrs.field(init=False, default=0)
    unrouted_outputs: int = attrs.field(init=False, default=0)
    # rid -> identity of the client that sent it, while the request is live.
    _routes: dict[str, bytes] = attrs.field(init=False, factory=dict)
    _to_abort: list[str] = attrs.field(init=False, factory=list)
    _socket: zmq.Socket = attrs.field(init=False, default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        check_endpoint(self.endpoint, bind=True, allow_remote=self.allow_remote)
        socket = zmq.Context.instance().socket(zmq.ROUTER)
        # A send to a client that is gone fails (EHOSTUNREACH) instead of vanishing.
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        socket.setsockopt(zmq.SNDHWM, self.max_queued_per_client)
        # A peer that sends a larger message is disconnected before it is read.
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        try:
            socket.bind(self.endpoint)
        except zmq.ZMQError as exc:
            socket.close(linger=0)
            raise ValueError(f"cannot bind ROUTER socket to {self.endpoint!r}: {exc}") from None
        self.bound_endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._socket = socket

    @property
    def live_requests(self) -> int:
        """Requests taken and not yet finished."""
        return len(self._routes)

    # -- requests in ------------------------------------------------------------------------

    def recv_requests(self) -> list[Req | ControlRequest]:
        """What arrived since the last call, decoded (refusals answered), plus aborts for the
        requests of clients that went away; never blocks, never raises."""
        items: list[Req | ControlRequest] = [
            ControlRequest(type="abort", rid=rid) for rid in self._to_abort
        ]
        self._to_abort = []
        socket = self._socket
        if socket.closed:
            return items
        for _ in range(self.max_recv_per_call):
            try:
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
        identity = frames[0]
        if len(frames) != 2:
            return self._refuse(
                identity, f"expected one message frame from a DEALER, got {len(frames) - 1}"
            )
        try:
            msg = decode_request(frames[1])
        except msgspec.DecodeError as exc:
            return self._refuse(
                identity,
                f"{exc}; valid messages: GenerateReqInput (kind 'generate'), "
                "ControlReq (kind 'control')",
                _rid_of(frames[1]),
            )
        if isinstance(msg, ControlReq):
            return self._control(identity, msg)
        if msg.rid in self._routes:
            return self._refuse(identity, f"rid {msg.rid!r} is already in flight", msg.rid)
        self._routes[msg.rid] = identity
        return msg.to_req()

    def _control(self, identity: bytes, msg: ControlReq) -> ControlRequest | None:
        if msg.type == "abort" and self._routes.get(msg.rid) != identity:
            return self._refuse(
                identity, f"abort needs the rid of one of your live requests, got {msg.rid!r}"
            )
        return ControlRequest(
            type=msg.type, mode=msg.mode, rid=msg.rid, send_reply=partial(self._reply, identity)
        )

    def _refuse(self, identity: bytes, problem: str, rid: str | None = None) -> None:
        self.malformed_count += 1
        log.warning("request refused", problem=problem, peer=identity.hex())
        self._send(identity, encode(ErrorReply(message=problem, rid=rid)))
        return None

    def _reply(self, identity: bytes, reply: ControlReply) -> None:
        self._send(identity, encode(reply))

    # -- outputs out ------------------------------------------------------------------------

    def send(self, msg: OutputMessage) -> None:
        """Send each client the part of ``msg`` that concerns its own requests; finished
        requests are forgotten. Outputs of requests this server did not take are dropped and
        counted in ``unrouted_outputs``."""
        routes = self._routes
        by_client: dict[bytes, list[int]] = {}
        for i, rid in enumerate(msg.rids):
            identity = routes.get(rid)
            if identity is not None:
                by_client.setdefault(identity, []).append(i)
            else:
                if not self.unrouted_outputs:
                    log.warning("output of a request no client sent; dropped", rid=rid)
                self.unrouted_outputs += 1
        whole = len(by_client) == 1 and len(next(iter(by_client.values()))) == len(msg.rids)
        for identity, rows in by_client.items():
            self._send(identity, encode(msg if whole else _rows(msg, rows)))
        for rid, reason in zip(msg.rids, msg.finished_reasons, strict=True):
            if reason is not None:
                routes.pop(rid, None)

    def _send(self, identity: bytes, payload: bytes) -> bool:
        if self._socket.closed:
            return False
        try:
            self._socket.send_multipart((identity, payload), zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:  # EAGAIN: too slow; EHOSTUNREACH: gone
            self._drop_client(identity, "too slow" if exc.errno == zmq.EAGAIN else "gone")
            return False

    def _drop_client(self, identity: bytes, why: str) -> None:
        rids = [rid for rid, owner in self._routes.items() if owner == identity]
        for rid in rids:
            del self._routes[rid]
        self._to_abort += rids
        if rids:
            self.clients_dropped += 1
            log.warning("client dropped", why=why, peer=identity.hex(), aborted=len(rids))

    # -- the loop's helpers -----------------------------------------------------------------

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until a message is readable; True if one is."""
        if self._socket.closed:
            return False
        return bool(self._to_abort) or bool(self._socket.poll(int(timeout * 1000), zmq.POLLIN))

    def close(self) -> None:
        """Close the socket (pending messages wait at most ``linger_ms``)."""
        if not self._socket.closed:
            self._socket.close(linger=self.linger_ms)


def _rows(msg: OutputMessage, rows: list[int]) -> OutputMessage:
    """``msg`` with only the given rows of its per-request columns."""
    n = len(msg.rids)
    fields = {}
    for name in msg.__struct_fields__:
        value = getattr(msg, name)
        if isinstance(value, list) and len(value) == n:
            value = [value[i] for i in rows]
        fields[name] = value
    return type(msg)(**fields)


def _rid_of(payload: bytes) -> str | None:
    """The rid of a message that failed to decode, if it is a map with a string rid."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        return None
    rid = raw.get("rid") if isinstance(raw, dict) else None
    return rid if isinstance(rid, str) and len(rid) <= 256 else None
