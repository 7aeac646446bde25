"""The front end's connection to the scheduler's edge: a ZMTP 3 DEALER (the ZeroMQ wire
protocol, NULL mechanism) spoken on the event loop's own transport, so that it interoperates
with the scheduler's ``zmq_server`` and with any libzmq ROUTER (the fleet's gateway).

Speaking ZMTP here rather than through libzmq saves the front end about a quarter of its CPU
per short request: no libzmq I/O thread woken for each message, and the messages of one
event-loop iteration leave in one write. Messages sent before the scheduler's greeting
arrives wait for it; the scheduler's messages are parsed by ``ZmtpReader`` (one frame each;
PINGs answered). A scheduler that closes the connection, breaks the protocol or sends a
message over ``MAX_MESSAGE_BYTES`` ends the link: ``on_lost`` is called with the reason.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from schedkit.components.io.zmtp import GREETING, ZmtpReader, command, frame_header
from schedkit.endpoints import tcp_address

__all__ = ["MAX_MESSAGE_BYTES", "SchedulerLink", "connect_endpoint"]

# The scheduler is trusted, but a message is still held whole before it is decoded.
MAX_MESSAGE_BYTES = 256 << 20
_READY = command(b"READY", {b"Socket-Type": b"DEALER"})


def connect_endpoint(endpoint: str) -> socket.socket:
    """A connected, non-blocking stream socket to ``ipc://PATH`` or ``tcp://HOST:PORT``;
    ValueError naming the endpoint when it is of another kind, ConnectionError when nothing
    listens there."""
    try:
        if endpoint.startswith("ipc://"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(endpoint[len("ipc://") :])
            except BaseException:
                sock.close()
                raise
        elif endpoint.startswith("tcp://"):
            _, host, port = tcp_address(endpoint)
            if not host or not port.isdigit():
                raise ValueError(f"scheduler endpoint {endpoint!r}: expected tcp://HOST:PORT")
            sock = socket.create_connection((host, int(port)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            raise ValueError(
                f"scheduler endpoint {endpoint!r}: the front end connects to ipc://PATH or "
                "tcp://HOST:PORT"
            )
    except OSError as exc:
        raise ConnectionError(f"cannot connect to the scheduler at {endpoint}: {exc}") from None
    sock.setblocking(False)
    return sock


class SchedulerLink(asyncio.Protocol):
    """One DEALER connection: ``send`` a message, ``on_message`` for each one received."""

    def __init__(
        self,
        endpoint: str,
        on_message: Callable[[bytes], None],
        on_lost: Callable[[str], None],
    ) -> None:
        self.endpoint = endpoint
        self.on_message = on_message
        self.on_lost = on_lost
        self.closed = False
        self._reader = ZmtpReader(max_frame_bytes=MAX_MESSAGE_BYTES, max_frames=1)
        self._pending: list[bytes] = []
        self._flush_scheduled = False
        # libzmq drops a peer whose READY arrives with its greeting: READY and the messages
        # wait for the scheduler's greeting.
        self._greeted = False
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Connect now (raises ConnectionError or ValueError) and attach the connection to
        ``loop``; messages sent meanwhile leave once it is attached."""
        self._loop = loop
        sock = connect_endpoint(self.endpoint)
        loop.create_task(self._attach(loop, sock))

    async def _attach(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        try:
            if sock.family == socket.AF_UNIX:
                await loop.create_unix_connection(lambda: self, sock=sock)
            else:
                await loop.create_connection(lambda: self, sock=sock)
        except OSError as exc:
            sock.close()
            self._lost(f"cannot attach the scheduler connection: {exc}")

    def send(self, payload: bytes) -> None:
        """Queue one single-frame message; the messages of this loop iteration leave
        together."""
        if self.closed:
            raise ConnectionError("the scheduler connection is closed")
        self._pending += (frame_header(len(payload)), payload)
        if not self._flush_scheduled and self._greeted:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self._transport
        if transport is not None and self._greeted and self._pending:
            pending, self._pending = self._pending, []
            transport.writelines(pending)

    def close(self) -> None:
        """Close the connection (``on_lost`` is not called)."""
        self.closed = True
        self._pending = []
        if self._transport is not None:
            self._transport.close()

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._transport = transport
        if self.closed:
            transport.close()
            return
        transport.write(GREETING)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        messages = reader.feed(data)
        if not self._greeted and reader.greeted:
            self._greeted = True
            self._transport.write(_READY)
            self._flush()
        if reader.replies:
            self._transport.writelines(reader.replies)
            reader.replies.clear()
        on_message = self.on_message
        for message in messages:
            if message.oversize:
                self._lost(f"a message of {message.oversize} bytes (at most {MAX_MESSAGE_BYTES})")
                return
            on_message(message.last)
        if reader.error is not None:
            self._lost(f"the scheduler broke the protocol: {reader.error}")

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._lost("the scheduler closed the connection" + (f": {exc}" if exc else ""))

    def _lost(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self._pending = []
        if self._transport is not None:
            self._transport.close()
        self.on_lost(reason)
