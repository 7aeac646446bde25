"""How the request edge sends: each connection's queue of unsent messages, bounded per
connection and in total, flushed as far as its socket takes it. Mixed into
``ConnectionTable``."""

from __future__ import annotations

import selectors

from schedkit.components.io.edge_connection import Connection
from schedkit.components.io.zmtp import encode_message

__all__ = ["OutboundQueues"]


class OutboundQueues:
    """``send`` and the queueing and flushing behind it, of ``ConnectionTable``.

    Uses the table's bounds (``max_queued_messages``, ``max_queued_bytes``,
    ``max_queued_total_bytes``), ``connections``, ``_selector`` and ``close``; counts
    ``queued_bytes`` and ``closed_for_bounds``.
    """

    __slots__ = ()

    def send(self, conn: Connection, frames: tuple[bytes, ...]) -> str | None:
        """Queue a message for ``conn`` (behind its envelope) and send what the socket takes;
        the reason, if the connection was closed for being too slow."""
        if conn.closed:
            return "gone"
        if len(conn.out) >= self.max_queued_messages:
            return self._too_slow(conn, f"{len(conn.out)} messages unread (max_queued_messages)")
        data = encode_message((*conn.envelope, *frames))
        if conn.out_bytes + len(data) > self.max_queued_bytes:
            return self._too_slow(conn, f"{conn.out_bytes} bytes unread (max_queued_bytes)")
        self._queue(conn, data)
        if self.queued_bytes > self.max_queued_total_bytes:
            largest = max(self.connections, key=lambda c: c.out_bytes)
            self._too_slow(largest, "the largest unread queue over max_queued_total_bytes")
        return "too slow" if conn.closed else None

    def _too_slow(self, conn: Connection, why: str) -> str:
        self.closed_for_bounds += 1
        self.close(conn, f"too slow: {why}")
        return "too slow"

    def _queue(self, conn: Connection, data: bytes) -> None:
        was_empty = not conn.out
        conn.out.append(memoryview(data))
        conn.out_bytes += len(data)
        self.queued_bytes += len(data)
        if was_empty:
            self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        if conn.closed:  # e.g. evicted earlier in the same poll
            return
        out = conn.out
        while out:
            try:
                sent = conn.sock.send(out[0])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self.close(conn, f"gone ({exc.strerror})")
                return
            conn.out_bytes -= sent
            self.queued_bytes -= sent
            if sent == len(out[0]):
                out.popleft()
            else:
                out[0] = out[0][sent:]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0)
        if self._selector.get_key(conn.sock).events != events:
            self._selector.modify(conn.sock, events, conn)
