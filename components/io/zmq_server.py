"""The scheduler's network edge: one ZeroMQ ROUTER socket on which clients send requests and
control messages and get back their own outputs, replies and refusals.

(Longer than 300 lines: what a hostile client can try, and each defence, read best together.)

Wire protocol (a client connects a DEALER socket; every message is one msgpack frame, see
``schedkit.components.io.io_struct``):

- client -> server: ``GenerateReqInput`` or ``ControlReq`` (``pause``, ``continue``, ``flush``,
  ``get_loads``, ``abort`` of one of the client's own rids);
- server -> client: ``BatchTokenIDOutput`` / ``BatchEmbeddingOutput`` holding only the
  client's own requests, ``ControlReply``, and ``ErrorReply`` for anything refused, naming what
  is wrong: not msgpack, not a known message, a bad field, a rid already in flight, extra
  frames (a REQ socket's envelope is answered with its empty delimiter, so that REQ reads it),
  a frame over ``max_message_bytes``, nesting deeper than the decoder's recursion limit, a
  waiting limit. A refusal is cut to 1,000 characters in the middle (it quotes what it
  refuses, as long as the client made it; the place comes last).

Frames: one over ``max_message_bytes`` (8 MiB) is refused by its length alone; libzmq
disconnects, without a word, a peer whose frame exceeds 4 x ``max_message_bytes``
(``MAXMSGSIZE``), and buffers at most ``max_unread_per_client`` unread messages of a
connection (TCP pushes back on the rest). What this does not bound (libzmq 4.3 offers no
way to): memory grows with the number of connections, each holding the frame it is sending
(up to 4 x ``max_message_bytes``) until it is whole; the frames of a message are not
limited in number (libzmq keeps at least 64 bytes for each until the message is read); and a
message's frames count towards ``max_unread_per_client`` only once its last frame arrived, so
a peer speaking ZMTP itself that sends frames flagged "more" without end grows the server
until it disconnects. Frames are decoded only against the message schema, never schema-less:
skipped values build nothing, and nesting deeper than the interpreter's recursion limit stops
the decoder (answered like any decode error).

A client is one connection: its routing id and the socket descriptor its messages arrive on
(``SRCFD``). A socket monitor reports each closed connection; the reports are read before
every message received and every output sent. A departed client's waiting requests are
aborted at once (their KV freed) and their outputs, the final one included, go nowhere
(``departed_outputs``); their rids stay taken until that final output. Messages that were on
their way when a connection closed are dropped unread (``departed_messages``: a descriptor
stays closed until the monitor reports a new connection accepted on it), and aborts are handed
out after the requests read in the same call, so no request of a departed client runs. A
newcomer that takes a departed client's routing id, or its descriptor, is a different client
and gets none of them.
(libzmq gives a routing id to one connection at a time, ignoring a second one that presents
it, and emits a connection's close before its routing id or descriptor can be reused. What is
left is a window of microseconds: a connection closing after the reports were read, and a
newcomer with its routing id attached, both before the next send.) Sends never block the
scheduler: each client has a queue of ``max_queued_per_client`` messages; a client whose queue
is full (too slow) or that is gone has its requests aborted the same way. Either is counted in
``clients_dropped``. Control replies go to the connection that asked, or nowhere.

Reading: one ``recv_requests`` call reads at most ``max_recv_per_call`` messages and stops
after ``max_recv_bytes_per_call`` bytes, so that a client sending large frames as fast as it
can (each decoded before it is refused) does not hold up every other client's generation.

Admission: requests taken and not yet finished ("waiting") are limited per client
(``max_waiting_requests_per_client``, ``max_waiting_tokens_per_client``; tokens are prompt
tokens) and in total (``max_waiting_requests``, ``max_waiting_tokens``); a request over a limit
is refused with an ``ErrorReply`` naming the limit. Prompts reach the scheduler packed, 4 bytes
a token, until it admits them into a batch. Control messages are never limited.

Routing ids: never sent to clients; ``ROUTER_HANDOVER`` stays off. libzmq 4.3 aborts the
process (a failed assertion) when it gives an anonymous peer an automatic routing id
(``b"\\x00"`` + a 32-bit counter) that a peer already took as its explicit ``ROUTING_ID``, and
it starts the counter from ``rand()``, which nothing seeds. ``rand()`` is seeded from
``os.urandom`` before the socket is created (``endpoints.unpredictable_routing_ids``), so the
next automatic id must be guessed among 2^32 values: this stays a probability, not a
guarantee (each squatting connection succeeds with a chance of about the anonymous connections
still to come while it stays, over 2^32). Logged warnings (refusals, dropped clients) are
limited to one a second of each kind.

Outputs of requests that no client sent (submitted in process) have nowhere to go: they are
counted in ``unrouted_outputs`` and the first is logged. Use it in a wiring as both the
scheduler's ``request_receiver`` and the output streamer's ``sender``.
"""

from __future__ import annotations

import os
import time
from functools import partial

import attrs
import msgspec
import structlog
import zmq
from schedkit.components.io.io_struct import (
    BatchEmbeddingOutput,
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    ControlRequest,
    ErrorReply,
    check_endpoint,
    decode_request,
    encode,
    rid_of,
)
from zmq.utils.monitor import parse_monitor_message

from schedkit.core.component import at_least, component
from schedkit.core.schedule_batch import Req
from schedkit.endpoints import unpredictable_routing_ids

__all__ = ["ZmqServer"]

log = structlog.get_logger(__name__)

OutputMessage = BatchTokenIDOutput | BatchEmbeddingOutput
# What a frame costs libzmq and the loop beyond its bytes (libzmq's zmq_msg_t is 64 bytes).
_FRAME_COST = 64
# Refusals are cut to this length (a client that never reads has them queued).
_MAX_PROBLEM_CHARS = 1000
VALID_MESSAGES = "valid messages: GenerateReqInput (kind 'generate'), ControlReq (kind 'control')"


@attrs.define(slots=True)
class _Warnings:
    """Logs each kind of warning at most once per ``interval`` seconds, with how many were
    left out since: a client that sends refused messages as fast as it can must not turn
    the log (and a stderr pipe that fills) into the thing that stalls the loop."""

    interval: float = 1.0
    _last: dict[str, float] = attrs.Factory(dict)
    _left_out: dict[str, int] = attrs.Factory(dict)

    def warning(self, event: str, **fields: object) -> None:
        """Log ``event`` unless one was logged less than ``interval`` seconds ago."""
        now = time.monotonic()
        if now - self._last.get(event, -self.interval) < self.interval:
            self._left_out[event] = self._left_out.get(event, 0) + 1
            return
        self._last[event] = now
        left_out = self._left_out.pop(event, 0)
        log.warning(event, **fields, **({"not_logged_since": left_out} if left_out else {}))


@attrs.define(slots=True)
class _Message:
    """One message as the ROUTER hands it over: the sender's routing id, its first and last
    frames (the same for a one-frame message), how many frames it had, and what reading it
    counts against ``max_recv_bytes_per_call`` (each frame at least ``_FRAME_COST``)."""

    identity: bytes
    first: zmq.Frame
    last: zmq.Frame
    parts: int
    cost: int

    @classmethod
    def receive(cls, socket: zmq.Socket) -> _Message:
        """The next message; raises ``zmq.Again`` if none is waiting. Frames between the first
        and the last are dropped as they are read: a message of a million frames holds two."""
        identity = socket.recv(zmq.NOBLOCK)
        first = last = socket.recv(copy=False)  # a message arrives whole
        parts, cost = 1, max(len(first), _FRAME_COST)
        while last.more:
            last = socket.recv(copy=False)
            parts += 1
            cost += max(len(last), _FRAME_COST)
        return cls(identity, first, last, parts, cost)


@attrs.define(slots=True, eq=False)
class _Client:
    """One connection: its routing id, its socket descriptor (-1 for inproc) and its waiting
    requests."""

    identity: bytes
    fd: int
    rids: set[str] = attrs.Factory(set)
    tokens: int = 0


@attrs.define(slots=True, eq=False)
class _Route:
    """Where a live request's outputs go: its client, or None once the client departed."""

    client: _Client | None
    tokens: int


@component("zmq_server")
class ZmqServer:
    """Requests in and each client's own outputs out, on one ROUTER socket; see the module
    docstring. Binds a loopback address unless ``allow_remote``; port 0 picks a free port
    (``bound_endpoint``)."""

    endpoint: str = "tcp://127.0.0.1:0"
    allow_remote: bool = False
    max_recv_per_call: int = attrs.field(default=4096, validator=at_least(1))
    max_recv_bytes_per_call: int = attrs.field(default=4 << 20, validator=at_least(1))
    max_queued_per_client: int = attrs.field(default=1000, validator=at_least(1))
    max_unread_per_client: int = attrs.field(default=64, validator=at_least(1))
    max_message_bytes: int = attrs.field(default=8 << 20, validator=at_least(1024))
    max_waiting_requests_per_client: int = attrs.field(default=1024, validator=at_least(1))
    max_waiting_tokens_per_client: int = attrs.field(default=1 << 20, validator=at_least(1))
    max_waiting_requests: int = attrs.field(default=4096, validator=at_least(1))
    max_waiting_tokens: int = attrs.field(default=4 << 20, validator=at_least(1))
    linger_ms: int = 0
    bound_endpoint: str = attrs.field(init=False, default="")
    malformed_count: int = attrs.field(init=False, default=0)
    clients_dropped: int = attrs.field(init=False, default=0)
    unrouted_outputs: int = attrs.field(init=False, default=0)
    departed_outputs: int = attrs.field(init=False, default=0)
    departed_messages: int = attrs.field(init=False, default=0)
    waiting_tokens: int = attrs.field(init=False, default=0)
    # rid -> route, from the request's arrival to its final output.
    _routes: dict[str, _Route] = attrs.field(init=False, factory=dict)
    # The connections seen and not closed, by routing id and by descriptor.
    _by_identity: dict[bytes, _Client] = attrs.field(init=False, factory=dict)
    _by_fd: dict[int, _Client] = attrs.field(init=False, factory=dict)
    # Descriptors whose connection closed and that no new connection took since: messages
    # still arriving on one are the closed connection's, dropped unread.
    _closed_fds: set[int] = attrs.field(init=False, factory=set)
    _to_abort: list[str] = attrs.field(init=False, factory=list)
    _socket: zmq.Socket = attrs.field(init=False, default=None, repr=False)
    _monitor: zmq.Socket = attrs.field(init=False, default=None, repr=False)
    _poller: zmq.Poller = attrs.field(init=False, factory=zmq.Poller, repr=False)
    _warnings: _Warnings = attrs.field(init=False, factory=_Warnings, repr=False)

    def __attrs_post_init__(self) -> None:
        check_endpoint(self.endpoint, bind=True, allow_remote=self.allow_remote)
        context = zmq.Context.instance()
        unpredictable_routing_ids()
        socket = context.socket(zmq.ROUTER)
        # A send to a client that is gone fails (EHOSTUNREACH) instead of vanishing.
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        socket.setsockopt(zmq.SNDHWM, self.max_queued_per_client)
        # What a connection sends beyond this waits in its own buffers (TCP pushes back).
        socket.setsockopt(zmq.RCVHWM, self.max_unread_per_client)
        # Frames between max_message_bytes and this get an ErrorReply; larger ones cost the
        # peer its connection before they are read.
        socket.setsockopt(zmq.MAXMSGSIZE, 4 * self.max_message_bytes)
        # Each accepted and closed connection is reported; the queue is unbounded so that none
        # is lost.
        address = f"inproc://schedkit-zmq-server-monitor-{os.urandom(8).hex()}"
        socket.monitor(address, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        monitor = context.socket(zmq.PAIR)
        monitor.setsockopt(zmq.RCVHWM, 0)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
        try:
            socket.bind(self.endpoint)
        except zmq.ZMQError as exc:
            socket.disable_monitor()
            monitor.close()
            socket.close(linger=0)
            raise ValueError(f"cannot bind ROUTER socket to {self.endpoint!r}: {exc}") from None
        self.bound_endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._socket, self._monitor = socket, monitor
        self._poller.register(socket, zmq.POLLIN)
        self._poller.register(monitor, zmq.POLLIN)

    @property
    def live_requests(self) -> int:
        """Requests taken and not yet finished (a departed client's until their final
        output)."""
        return len(self._routes)

    # -- requests in ------------------------------------------------------------------------

    def recv_requests(self) -> list[Req | ControlRequest]:
        """What arrived since the last call, decoded (refusals answered), plus aborts for the
        requests of clients that went away; never blocks, never raises."""
        socket = self._socket
        items: list[Req | ControlRequest] = []
        if not socket.closed:
            monitor = self._monitor
            received, max_bytes = 0, self.max_recv_bytes_per_call
            for _ in range(self.max_recv_per_call):
                if monitor.get(zmq.EVENTS) & zmq.POLLIN:
                    self._read_connection_events()
                try:
                    message = _Message.receive(socket)
                except zmq.Again:
                    break
                except zmq.ZMQError as exc:
                    log.error("request socket failed", endpoint=self.bound_endpoint, error=str(exc))
                    break
                item = self._parse(message)
                if item is not None:
                    items.append(item)
                received += message.cost
                if received >= max_bytes:  # decoding takes time: the loop must go on
                    break
        # The aborts go last: a request read in this call may be one of them.
        aborts = [ControlRequest(type="abort", rid=rid) for rid in self._to_abort]
        self._to_abort = []
        return items + aborts

    def _parse(self, message: _Message) -> Req | ControlRequest | None:
        payload = message.last
        fd = _source_fd(payload)
        if fd in self._closed_fds:  # sent just before its connection closed: nobody to serve
            self.departed_messages += 1
            return None
        client = self._client(message.identity, fd)
        if message.parts == 2 and not len(message.first):
            # A REQ socket's envelope: it reads only answers that carry the empty delimiter.
            return self._refuse(
                client,
                "got a REQ socket's envelope (an empty frame, then the message); connect a "
                "DEALER and send each message as one frame",
                envelope=(b"",),
            )
        if message.parts != 1:
            return self._refuse(
                client, f"expected one message frame from a DEALER, got {message.parts}"
            )
        size = len(payload)
        if size > self.max_message_bytes:
            return self._refuse(
                client,
                f"message is {size} bytes; the limit is {self.max_message_bytes} bytes "
                "(max_message_bytes)",
            )
        data = payload.buffer
        try:
            msg = decode_request(data)
        except msgspec.ValidationError as exc:
            return self._refuse(client, f"{exc}; {VALID_MESSAGES}", rid_of(data))
        except msgspec.DecodeError as exc:
            return self._refuse(client, f"{exc}; {VALID_MESSAGES}")
        except RecursionError:
            return self._refuse(
                client,
                f"message nested too deeply to decode (requests nest 3 levels); {VALID_MESSAGES}",
            )
        if isinstance(msg, ControlReq):
            return self._control(client, msg)
        rid, tokens = msg.rid, len(msg.input_ids)
        if rid in self._routes:
            return self._refuse(client, f"rid {rid!r} is already in flight", rid)
        over = self._over_limit(client, tokens)
        if over is not None:
            return self._refuse(client, over, rid)
        self._routes[rid] = _Route(client, tokens)
        client.rids.add(rid)
        client.tokens += tokens
        self.waiting_tokens += tokens
        return msg.to_req()

    def _over_limit(self, client: _Client, tokens: int) -> str | None:
        """Which waiting limit a request of ``tokens`` prompt tokens would exceed, if any."""
        if len(client.rids) >= self.max_waiting_requests_per_client:
            return (
                f"this client already has {len(client.rids)} requests waiting "
                f"(max_waiting_requests_per_client={self.max_waiting_requests_per_client}); "
                "send more once some finish"
            )
        if client.tokens + tokens > self.max_waiting_tokens_per_client:
            return (
                f"{tokens} prompt tokens would bring this client's waiting tokens to "
                f"{client.tokens + tokens} (max_waiting_tokens_per_client="
                f"{self.max_waiting_tokens_per_client}); send it once some requests finish"
            )
        if len(self._routes) >= self.max_waiting_requests:
            return (
                f"the server has {len(self._routes)} requests waiting "
                f"(max_waiting_requests={self.max_waiting_requests}); retry later"
            )
        if self.waiting_tokens + tokens > self.max_waiting_tokens:
            return (
                f"{tokens} prompt tokens would bring the server's waiting tokens to "
                f"{self.waiting_tokens + tokens} (max_waiting_tokens="
                f"{self.max_waiting_tokens}); retry later"
            )
        return None

    def _control(self, client: _Client, msg: ControlReq) -> ControlRequest | None:
        if msg.type == "abort" and msg.rid not in client.rids:
            return self._refuse(
                client, f"abort needs the rid of one of your live requests, got {msg.rid!r}"
            )
        return ControlRequest(
            type=msg.type, mode=msg.mode, rid=msg.rid, send_reply=partial(self._reply, client)
        )

    def _refuse(
        self, client: _Client, problem: str, rid: str | None = None, envelope: tuple = ()
    ) -> None:
        self.malformed_count += 1
        problem = _shortened(problem)
        self._warnings.warning("request refused", problem=problem, peer=client.identity.hex())
        self._send(client, encode(ErrorReply(message=problem, rid=rid)), envelope)
        return None

    def _reply(self, client: _Client, reply: ControlReply) -> None:
        self._read_connection_events()
        if self._by_identity.get(client.identity) is client:  # else it left: nobody to tell
            self._send(client, encode(reply))

    # -- connections ------------------------------------------------------------------------

    def _client(self, identity: bytes, fd: int) -> _Client:
        """The connection a message came from. libzmq gives a routing id to one connection
        at a time, and a descriptor is reused only once its connection closed: a known id on
        another descriptor, or a known descriptor under another id, means that the
        connection seen before is gone."""
        client = self._by_identity.get(identity)
        if client is not None and client.fd == fd:
            return client
        if client is not None:
            self._depart(client, "reconnected")
        if fd >= 0 and fd in self._by_fd:
            self._depart(self._by_fd[fd], "gone")
        client = _Client(identity, fd)
        self._by_identity[identity] = client
        if fd >= 0:
            self._by_fd[fd] = client
        return client

    def _read_connection_events(self) -> None:
        """Depart the clients whose connections the monitor reports closed, and mark their
        descriptors closed until a new connection is accepted on one."""
        monitor = self._monitor
        if monitor.closed:
            return
        while True:
            try:
                event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._closed_fds.discard(fd)
                continue
            self._closed_fds.add(fd)
            client = self._by_fd.get(fd)
            if client is not None:
                self._depart(client, "disconnected")

    def _depart(self, client: _Client, why: str) -> None:
        """Forget a connection; its waiting requests are aborted and their outputs dropped."""
        if self._by_identity.get(client.identity) is client:
            del self._by_identity[client.identity]
        if self._by_fd.get(client.fd) is client:
            del self._by_fd[client.fd]
        self._abandon(client, why)

    def _abandon(self, client: _Client, why: str) -> None:
        """Abort the client's waiting requests: they leave its count, not the total, until
        their final output passes."""
        if not client.rids:
            return
        routes = self._routes
        for rid in client.rids:
            routes[rid].client = None
        self._to_abort += client.rids
        self._warnings.warning(
            "client dropped", why=why, peer=client.identity.hex(), aborted=len(client.rids)
        )
        self.clients_dropped += 1
        client.rids = set()
        client.tokens = 0

    # -- outputs out ------------------------------------------------------------------------

    def send(self, msg: OutputMessage) -> None:
        """Send each client the part of ``msg`` that concerns its own requests; finished
        requests are forgotten. Outputs of departed clients' requests and of requests this
        server did not take are dropped and counted."""
        self._read_connection_events()
        routes = self._routes
        by_client: dict[_Client, list[int]] = {}
        for i, rid in enumerate(msg.rids):
            route = routes.get(rid)
            if route is None:
                if not self.unrouted_outputs:
                    log.warning("output of a request no client sent; dropped", rid=rid)
                self.unrouted_outputs += 1
            elif route.client is None:
                self.departed_outputs += 1
            else:
                by_client.setdefault(route.client, []).append(i)
        whole = len(by_client) == 1 and len(next(iter(by_client.values()))) == len(msg.rids)
        for client, rows in by_client.items():
            self._send(client, encode(msg if whole else _rows(msg, rows)))
        for rid, reason in zip(msg.rids, msg.finished_reasons, strict=True):
            if reason is not None:
                route = routes.pop(rid, None)
                if route is not None:
                    self._finished(rid, route)

    def _finished(self, rid: str, route: _Route) -> None:
        self.waiting_tokens -= route.tokens
        client = route.client
        if client is not None:
            client.rids.discard(rid)
            client.tokens -= route.tokens

    def _send(self, client: _Client, payload: bytes, envelope: tuple = ()) -> None:
        if self._socket.closed:
            return
        try:
            self._socket.send_multipart((client.identity, *envelope, payload), zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # EAGAIN: too slow; EHOSTUNREACH: gone
            if exc.errno == zmq.EAGAIN:
                self._abandon(client, "too slow")
            else:
                self._depart(client, "gone")

    # -- the loop's helpers -----------------------------------------------------------------

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until a message or a closed connection is
        readable; True if one is."""
        if self._socket.closed:
            return False
        return bool(self._to_abort) or bool(self._poller.poll(int(timeout * 1000)))

    def close(self) -> None:
        """Close the socket (pending messages wait at most ``linger_ms``) and its monitor."""
        if not self._socket.closed:
            # Closing a monitored socket first stalls later connections (libzmq 4.3.5).
            self._socket.disable_monitor()
            self._socket.close(linger=self.linger_ms)
        if not self._monitor.closed:
            self._monitor.close()


def _shortened(text: str) -> str:
    """``text`` cut in the middle to at most ``_MAX_PROBLEM_CHARS`` characters: a refusal
    quotes what it refuses (a field name, a value), which a client makes as long as it likes,
    and the place (``at `$.field```) comes last."""
    if len(text) <= _MAX_PROBLEM_CHARS:
        return text
    head, tail = _MAX_PROBLEM_CHARS * 3 // 5, _MAX_PROBLEM_CHARS * 3 // 10
    return f"{text[:head]}... ({len(text) - head - tail} characters left out) ...{text[-tail:]}"


def _source_fd(frame: zmq.Frame) -> int:
    """The socket descriptor a frame arrived on; -1 for inproc (libzmq knows none)."""
    try:
        return frame.get(zmq.SRCFD)
    except zmq.ZMQError:
        return -1


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
