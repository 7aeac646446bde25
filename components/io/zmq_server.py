"""The scheduler's request edge for internal clients on loopback (docs/serve.md): a ZMTP 3
listener that DEALER sockets connect to. A client sends ``GenerateReqInput`` and ``ControlReq``
(``pause``, ``continue`` and ``flush`` only with ``admin_token``; ``get_loads``; ``abort`` of
its own rids) and gets back only its own outputs, ``ControlReply`` and ``ErrorReply`` naming
what was refused (cut to 1,000 characters, the place last).

Bounds on what a peer can make it hold are kept by ``edge_connections`` (connections, partial
frames, frames per message, unsent output) and ``zmtp``. Whole messages read and not parsed yet
wait in ``edge_backlog`` (at most ``max_recv_bytes_per_call`` bytes plus one message: no more is
read meanwhile, and a connection is read again only once its own are parsed). One call of
``recv_requests``, made once per scheduler step, parses them one message per client in turns
for at most ``recv_seconds_per_call`` seconds (or a tenth of the step since the previous call,
if longer; at least one message), reading again when all are parsed and time is left, so a
flood adds a bounded time to each step and delays another client's message by at most one of
its own per turn. A client already at its waiting limit has its requests refused from their
kind and rid alone (read from the message's first bytes when they come first, as encoders write
them), without decoding their prompts.

Requests taken and not finished ("waiting") are limited per client and in total
(``waiting_limits``); when the total is full, a client with fewer waiting requests than the one
with the most displaces that one's newest request not yet handed to the scheduler. Requests
reach the scheduler in turns by client (``fair_release``). A departed client's requests are
dropped (not yet handed over) or aborted, and its outputs go nowhere; a ``pause`` it sent
``while_connected`` ends. Use it as both the scheduler's ``request_receiver`` and the output
streamer's ``sender``. Reading and parsing requests is in ``zmq_request_intake``.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
import msgspec
import structlog

from schedkit.components.io.admin_controls import AdminControls
from schedkit.components.io.edge_backlog import EdgeBacklog
from schedkit.components.io.edge_connections import Connection, ConnectionTable
from schedkit.components.io.edge_listen import descriptor_headroom, listen
from schedkit.components.io.edge_messages import (
    OutputMessage,
    RateLimitedWarnings,
    rows,
)
from schedkit.components.io.edge_routes import Routes
from schedkit.components.io.fair_release import FairRelease
from schedkit.components.io.io_struct import (
    ControlRequest,
    ErrorReply,
    check_endpoint,
    encode,
)
from schedkit.components.io.waiting_limits import WaitingLimits
from schedkit.components.io.zmq_request_intake import RequestIntake
from schedkit.core.component import ArgumentError, at_least, component
from schedkit.core.schedule_batch import Req

__all__ = ["ZmqServer"]

log = structlog.get_logger(__name__)

# Descriptors kept for the rest of the process (libzmq sockets, files) below the limit.
_DESCRIPTOR_RESERVE = 64
# Parsing may take this share of the time since the previous recv_requests call (the step
# between), when that is more than recv_seconds_per_call: a backlog drains during long steps.
_RECV_SHARE_OF_STEP = 0.1


@component("zmq_server")
class ZmqServer(RequestIntake):
    """Requests in and each client's own outputs out; see the module docstring. Binds a
    loopback address unless ``allow_remote``; port 0 picks a free port (``bound_endpoint``)."""

    endpoint: str = "tcp://127.0.0.1:0"
    allow_remote: bool = False
    admin_token: str | None = attrs.field(default=None, repr=False)
    max_connections: int = attrs.field(default=1024, validator=at_least(1))
    max_recv_bytes_per_call: int = attrs.field(default=4 << 20, validator=at_least(1))
    recv_seconds_per_call: float = attrs.field(default=0.001, validator=attrs.validators.gt(0))
    max_queued_per_client: int = attrs.field(default=1000, validator=at_least(1))
    max_queued_bytes_per_client: int = attrs.field(default=4 << 20, validator=at_least(1024))
    max_queued_bytes: int = attrs.field(default=64 << 20, validator=at_least(1024))
    max_message_bytes: int = attrs.field(default=8 << 20, validator=at_least(1024))
    max_partial_bytes: int = attrs.field(default=64 << 20, validator=at_least(1024))
    max_frames_per_message: int = attrs.field(default=64, validator=at_least(2))
    max_waiting_requests_per_client: int = attrs.field(default=1024, validator=at_least(1))
    max_waiting_tokens_per_client: int = attrs.field(default=1 << 20, validator=at_least(1))
    max_waiting_requests: int = attrs.field(default=4096, validator=at_least(1))
    max_waiting_tokens: int = attrs.field(default=4 << 20, validator=at_least(1))
    release_tokens_per_client: int = attrs.field(default=16384, validator=at_least(1))
    handshake_timeout: float = 10.0
    bound_endpoint: str = attrs.field(init=False, default="")
    malformed_count: int = attrs.field(init=False, default=0)
    clients_dropped: int = attrs.field(init=False, default=0)
    displaced_requests: int = attrs.field(init=False, default=0)
    connections: ConnectionTable = attrs.field(init=False, default=None, repr=False)
    _routes: Routes = attrs.field(init=False, factory=Routes, repr=False)
    _limits: WaitingLimits = attrs.field(init=False, default=None, repr=False)
    _fair: FairRelease = attrs.field(init=False, default=None, repr=False)
    _internal: list[ControlRequest] = attrs.field(init=False, factory=list, repr=False)
    _backlog: EdgeBacklog = attrs.field(init=False, factory=EdgeBacklog, repr=False)
    _last_call_end: float = attrs.field(init=False, default=0.0, repr=False)
    _admin: AdminControls = attrs.field(init=False, default=None, repr=False)
    _closed: bool = attrs.field(init=False, default=False)
    _warnings: RateLimitedWarnings = attrs.field(
        init=False, factory=RateLimitedWarnings, repr=False
    )

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too): the
        endpoint is one it can listen on (tcp or ipc; tcp on loopback unless ``allow_remote``)."""
        endpoint = args.endpoint
        if not endpoint.startswith(("tcp://", "ipc://")):
            why = (
                " (it speaks ZMTP on its own sockets; inproc:// belongs to libzmq)"
                if endpoint.startswith("inproc://")
                else ""
            )
            raise ArgumentError(
                "endpoint",
                f"zmq_server listens on tcp://HOST:PORT or ipc://PATH, got {endpoint!r}{why}",
            )
        try:
            check_endpoint(endpoint, bind=True, allow_remote=args.allow_remote)
        except ValueError as exc:
            raise ArgumentError("endpoint", str(exc)) from None

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)
        self._limits = WaitingLimits(
            per_client_requests=self.max_waiting_requests_per_client,
            per_client_tokens=self.max_waiting_tokens_per_client,
            total_requests=self.max_waiting_requests,
            total_tokens=self.max_waiting_tokens,
        )
        self._admin = AdminControls(self.admin_token)
        self._last_call_end = time.monotonic()
        self._fair = FairRelease(max_client_tokens=self.release_tokens_per_client)
        headroom = descriptor_headroom(_DESCRIPTOR_RESERVE)
        cap = min(self.max_connections, headroom)
        if cap < 1:
            raise ValueError(
                f"no descriptors left for connections (limit minus {_DESCRIPTOR_RESERVE} "
                "reserved); raise the open-files limit (ulimit -n)"
            )
        listener, self.bound_endpoint = listen(self.endpoint, backlog=min(cap, 1024))
        self.connections = ConnectionTable(
            listener=listener,
            on_close=self._departed,
            max_connections=cap,
            max_frame_bytes=self.max_message_bytes,
            max_frames=self.max_frames_per_message,
            max_partial_bytes=self.max_partial_bytes,
            max_queued_messages=self.max_queued_per_client,
            max_queued_bytes=self.max_queued_bytes_per_client,
            max_queued_total_bytes=self.max_queued_bytes,
            handshake_timeout=self.handshake_timeout,
            is_busy=self._is_busy,
        )

    @property
    def refused_controls(self) -> int:
        """Admin control messages refused for a missing or wrong token."""
        return self._admin.refused

    @property
    def waiting_tokens(self) -> int:
        """Prompt tokens of the requests taken and not yet finished."""
        return self._routes.tokens

    @property
    def unrouted_outputs(self) -> int:
        """Output rows of requests this server did not take (dropped)."""
        return self._routes.unrouted_outputs

    @property
    def departed_outputs(self) -> int:
        """Output rows of requests whose client left (dropped)."""
        return self._routes.departed_outputs

    @property
    def live_requests(self) -> int:
        """Requests taken and not yet finished (a departed client's until their final
        output)."""
        return len(self._routes)

    def client_of(self, req: Req) -> Connection | tuple[Connection | None, str] | None:
        """Whose ``req`` is, for the scheduler's fair shares between clients: the connection
        that sent it (None once it left, or for a request this server did not take), paired
        with the user it names (``GenerateReqInput.client``), if any."""
        route = self._routes.by_rid.get(req.rid)
        if route is None:
            return None
        return route.client if route.user is None else (route.client, route.user)

    # -- requests in ------------------------------------------------------------------------

    def recv_requests(self) -> list[Req | ControlRequest]:
        """What arrived since the last call, decoded (refusals answered), the next fair set of
        requests, and aborts for the requests of clients that went away; never blocks."""
        items: list[Req | ControlRequest] = []
        if not self._closed:
            start = time.monotonic()
            since = start - self._last_call_end
            deadline = start + max(self.recv_seconds_per_call, _RECV_SHARE_OF_STEP * since)
            # Read, parse; read again, until the deadline, while the backlog was all parsed
            # and time is left (the first read is bounded in bytes alone).
            read_until = None
            while self._read(read_until) and self._parse_backlog(items, deadline):
                read_until = deadline
            released, requeue = self._fair.release()
            items += released
            items += (ControlRequest(type="requeue", rid=rid) for rid in requeue)
        # Aborts and ends of pauses go last: a request handed over in this call may be aborted.
        items += self._internal
        self._internal = []
        self._last_call_end = time.monotonic()
        return items

    # -- clients leaving --------------------------------------------------------------------

    def _is_busy(self, client: Connection) -> bool:
        return bool(client.rids) or client is self._admin.pause_owner

    def _departed(self, client: Connection, why: str) -> None:
        """A connection closed: its held requests are dropped, the others aborted; a pause it
        owned ends."""
        self._backlog.drop(client)
        if self._admin.owner_left(client):
            self._internal.append(ControlRequest(type="continue"))
            log.info("pause ended: the connection that paused left", peer=client.peer)
        for req in self._fair.drop(client):
            self._routes.forget(req.rid)
        if client.rids:
            rids = self._routes.orphan(client)
            self._internal += (ControlRequest(type="abort", rid=rid) for rid in rids)
            self._warnings.warning("client dropped", why=why, peer=client.peer, aborted=len(rids))
            self.clients_dropped += 1
        else:
            for kind in ("too slow", "protocol", "partial"):  # each logged once a second
                if why.startswith(kind):
                    self._warnings.warning(f"connection closed: {kind}", why=why, peer=client.peer)

    # -- outputs out ------------------------------------------------------------------------

    def send(self, msg: OutputMessage) -> None:
        """Send each client the part of ``msg`` that concerns its own requests; finished
        requests are forgotten. Outputs of departed clients' requests and of requests this
        server did not take are dropped and counted."""
        by_client = self._routes.split(msg)
        whole = len(by_client) == 1 and len(next(iter(by_client.values()))) == len(msg.rids)
        for client, selected in by_client.items():
            self._send(client, msg if whole else rows(msg, selected))
        self._routes.finished(msg)

    def _send(self, client: Connection, message: msgspec.Struct) -> None:
        if not self._closed:
            self.connections.send(client, (encode(message),))

    # -- the loop's helpers -----------------------------------------------------------------

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until a client sent something or a request can be
        handed over; True if so."""
        if self._closed:
            return False
        if self._internal or self._backlog or self._fair.releasable():
            return True
        ready = bool(self.connections.poll(timeout))
        self._last_call_end = time.monotonic()  # time idle is no step: no share of it
        return ready

    def close(self) -> None:
        """Tell each client of its requests never handed to the scheduler (an ``ErrorReply``,
        sent as far as the socket takes it), then close every connection and the listener."""
        if self._closed:
            return
        for client, req in self._fair.drop_all():
            self._routes.forget(req.rid)
            problem = "the server shut down before this request was scheduled"
            self._send(client, ErrorReply(message=problem, rid=req.rid))
        self._closed = True
        self.connections.close_all()
