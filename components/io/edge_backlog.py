"""Whole messages the request edge has read and not parsed yet, kept per connection and taken
one per connection in turns, so that a client with a long backlog (a flood) delays another
client's next message by at most one message of its own per turn."""

from __future__ import annotations

from collections import deque

from schedkit.components.io.edge_connections import Connection
from schedkit.components.io.zmtp import ZmtpMessage

__all__ = ["EdgeBacklog", "message_bytes"]


def message_bytes(message: ZmtpMessage) -> int:
    """The bytes ``message`` holds (its first and last frames)."""
    last = len(message.last)
    return last if message.first is message.last else last + len(message.first)


class EdgeBacklog:
    """Per connection, the messages read and not yet taken, oldest first; ``bytes`` is what
    they hold. ``take`` serves the connections in turns: the one served goes to the back."""

    __slots__ = ("_queues", "bytes")

    def __init__(self) -> None:
        self._queues: dict[Connection, deque[ZmtpMessage]] = {}
        self.bytes = 0

    def __bool__(self) -> bool:
        return bool(self._queues)

    def __contains__(self, conn: object) -> bool:
        return conn in self._queues

    def add(self, conn: Connection, message: ZmtpMessage) -> None:
        """Queue ``message`` behind ``conn``'s earlier ones."""
        queue = self._queues.get(conn)
        if queue is None:
            queue = self._queues[conn] = deque()
        queue.append(message)
        self.bytes += message_bytes(message)

    def take(self) -> tuple[Connection, ZmtpMessage]:
        """The oldest message of the connection whose turn it is (IndexError when empty)."""
        if not self._queues:
            raise IndexError("the backlog is empty")
        conn = next(iter(self._queues))
        queue = self._queues.pop(conn)
        message = queue.popleft()
        if queue:
            self._queues[conn] = queue  # to the back: the next connection's turn
        self.bytes -= message_bytes(message)
        return conn, message

    def drop(self, conn: Connection) -> None:
        """Forget ``conn``'s messages (it closed)."""
        queue = self._queues.pop(conn, None)
        if queue:
            self.bytes -= sum(message_bytes(m) for m in queue)
