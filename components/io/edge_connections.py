"""The connections of the request edge: accepting them up to a cap, reading what they send into
ZMTP messages within byte budgets, and queueing what is sent back, on non-blocking sockets
polled by the scheduler's own thread (no I/O thread: what a peer has sent and the edge has not
read waits in the kernel, and TCP pushes back).

Bounds, each closing a connection that exceeds it:
- ``max_connections`` open at once, kept below the process's descriptor limit; at the cap, the
  connection idle longest (no request waiting) is closed to make room for a newcomer, and a
  newcomer is refused (closed at once) when every connection has requests waiting.
- a partially received frame is at most ``max_frame_bytes`` (larger frames are skipped unread,
  see ``zmtp``); partial frames of all connections together at most ``max_partial_bytes`` (the
  connection holding the most is closed);
- a message has at most ``max_frames`` frames;
- a connection's unsent messages at most ``max_queued_messages`` and ``max_queued_bytes``; all
  unsent bytes together at most ``max_queued_total_bytes`` (the largest queue is closed);
- a connection that has not finished its handshake in ``handshake_timeout`` seconds.

``Connection`` is declared in ``edge_connection``, sending in ``edge_sending``.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator

import attrs
import structlog

from schedkit.components.io.edge_connection import Connection
from schedkit.components.io.edge_sending import OutboundQueues
from schedkit.components.io.zmtp import GREETING, READY, ZmtpMessage, ZmtpReader

__all__ = ["Connection", "ConnectionTable"]

log = structlog.get_logger(__name__)

_RECV_CHUNK = 256 << 10
_ACCEPTS_PER_CALL = 256
_ACCEPT_PAUSE = 0.1  # seconds without accepting after the process ran out of descriptors


@attrs.define(slots=True, eq=False)
class ConnectionTable(OutboundQueues):
    """The open connections of one listening socket; see the module docstring. ``on_close``
    is told of every connection that closes (by the peer or by a bound) and why."""

    listener: socket.socket
    on_close: Callable[[Connection, str], None]
    max_connections: int
    max_frame_bytes: int
    max_frames: int
    max_partial_bytes: int
    max_queued_messages: int
    max_queued_bytes: int
    max_queued_total_bytes: int
    handshake_timeout: float
    is_busy: Callable[[Connection], bool]
    # Ordered from least to most recently active: the front is evicted first.
    connections: dict[Connection, None] = attrs.Factory(dict)
    partial_bytes: int = 0
    queued_bytes: int = 0
    refused: int = 0
    evicted: int = 0
    closed_for_bounds: int = 0
    _selector: selectors.BaseSelector = attrs.Factory(selectors.DefaultSelector)
    _accept_paused_until: float = 0.0
    _handshaking: deque[Connection] = attrs.Factory(deque)

    def __attrs_post_init__(self) -> None:
        self._selector.register(self.listener, selectors.EVENT_READ, None)

    def __iter__(self) -> Iterator[Connection]:
        return iter(self.connections)

    def __len__(self) -> int:
        return len(self.connections)

    # -- waiting and reading ----------------------------------------------------------------

    def poll(self, timeout: float) -> list[Connection]:
        """Wait up to ``timeout`` seconds; accept newcomers, send what waits, and return the
        connections with bytes to read."""
        self._resume_accepting()
        if self._accept_paused_until:
            timeout = min(timeout, max(0.0, self._accept_paused_until - time.monotonic()))
        readable = []
        for key, mask in self._selector.select(timeout):
            conn = key.data
            if conn is None:
                self._accept()
            else:
                if mask & selectors.EVENT_WRITE:
                    self._flush(conn)
                if mask & selectors.EVENT_READ and not conn.closed:
                    readable.append(conn)
        self._expire_handshakes()
        return readable

    def read(
        self, readable: list[Connection], max_bytes: int, deadline: float | None = None
    ) -> list[tuple[Connection, ZmtpMessage]]:
        """Read from ``readable`` connections in turns until each is drained, ``max_bytes``
        were read or (if given) the monotonic clock passed ``deadline`` (checked after each
        chunk); the whole messages received, in order per connection."""
        messages: list[tuple[Connection, ZmtpMessage]] = []
        left, turn = max_bytes, readable
        while turn and left > 0:
            if deadline is not None and time.monotonic() >= deadline:
                break
            next_turn = []
            for conn in turn:
                if conn.closed:
                    continue
                want = min(_RECV_CHUNK, left)
                try:
                    data = conn.sock.recv(want)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    self.close(conn, f"gone ({exc.strerror})")
                    continue
                if not data:
                    self.close(conn, "disconnected")
                    continue
                left -= len(data)
                self._received(conn, data, messages)
                if len(data) == want and not conn.closed:
                    next_turn.append(conn)
                if left <= 0 or (deadline is not None and time.monotonic() >= deadline):
                    break
            turn = next_turn
        return messages

    def _received(
        self, conn: Connection, data: bytes, messages: list[tuple[Connection, ZmtpMessage]]
    ) -> None:
        reader = conn.reader
        before, was_ready = reader.held, reader.ready
        got = reader.feed(data)
        self.partial_bytes += reader.held - before
        if reader.replies:
            for reply in reader.replies:
                self._queue(conn, reply)
            reader.replies.clear()
        if reader.ready and not was_ready and reader.peer_socket_type == b"REQ":
            conn.envelope = (b"",)
        if got:
            self.connections.pop(conn)
            self.connections[conn] = None  # most recently active
            messages += ((conn, m) for m in got)
        if reader.error is not None:
            self.closed_for_bounds += 1
            self.close(conn, f"protocol: {reader.error}")
        elif self.partial_bytes > self.max_partial_bytes:
            largest = max(self.connections, key=lambda c: c.reader.held)
            self.closed_for_bounds += 1
            self.close(
                largest,
                f"partial frames of all connections over max_partial_bytes "
                f"({self.max_partial_bytes}); this one held {largest.reader.held} bytes",
            )

    # -- accepting and closing ---------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_CALL):
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # The backlog stays readable: stop polling it for a while, not spin.
                    log.warning("out of descriptors; not accepting for 0.1 s", error=str(exc))
                    self._selector.unregister(self.listener)
                    self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE
                return
            if len(self.connections) >= self.max_connections and not self._evict_one():
                self.refused += 1
                sock.close()
                continue
            sock.setblocking(False)
            peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else "ipc"
            reader = ZmtpReader(max_frame_bytes=self.max_frame_bytes, max_frames=self.max_frames)
            conn = Connection(sock, peer, reader, time.monotonic())
            self.connections[conn] = None
            self._handshaking.append(conn)
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._queue(conn, GREETING + READY)

    def _evict_one(self) -> bool:
        """Close the connection idle longest that has no request waiting; False if none."""
        for conn in self.connections:
            if not self.is_busy(conn):
                self.evicted += 1
                self.close(conn, "evicted: the connection cap was reached and it was idle longest")
                return True
        return False

    def _resume_accepting(self) -> None:
        if self._accept_paused_until and time.monotonic() >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._selector.register(self.listener, selectors.EVENT_READ, None)

    def _expire_handshakes(self) -> None:
        pending, cutoff = self._handshaking, time.monotonic() - self.handshake_timeout
        while pending and (pending[0].closed or pending[0].reader.ready):
            pending.popleft()
        while pending and pending[0].accepted_at < cutoff:
            conn = pending.popleft()
            if not conn.closed and not conn.reader.ready:
                self.closed_for_bounds += 1
                self.close(conn, f"no handshake within {self.handshake_timeout:g} s")

    def close(self, conn: Connection, why: str) -> None:
        """Close ``conn`` and forget what it held; ``on_close`` is told."""
        if conn.closed:
            return
        conn.closed = True
        self.partial_bytes -= conn.reader.held
        self.queued_bytes -= conn.out_bytes
        conn.out.clear()
        conn.out_bytes = 0
        conn.reader.buffer = bytearray()
        self.connections.pop(conn, None)
        self._selector.unregister(conn.sock)
        conn.sock.close()
        self.on_close(conn, why)

    def close_all(self) -> None:
        """Close every connection (without telling ``on_close``) and the listener."""
        for conn in list(self.connections):
            conn.closed = True
            self._selector.unregister(conn.sock)
            conn.sock.close()
        self.connections.clear()
        if not self._accept_paused_until:
            self._selector.unregister(self.listener)
        self.listener.close()
        self._selector.close()
