"""One client connection of the request edge: its socket, ZMTP reader, unsent output and the
server's bookkeeping of its requests."""

from __future__ import annotations

import socket
from collections import deque

import attrs

from schedkit.components.io.zmtp import ZmtpReader

__all__ = ["Connection"]


@attrs.define(slots=True, eq=False)
class Connection:
    """One client connection: its socket, what it sent and has not completed, what it is to be
    sent, and the server's bookkeeping of its requests."""

    sock: socket.socket
    peer: str
    reader: ZmtpReader
    accepted_at: float
    envelope: tuple[bytes, ...] = ()
    out: deque[memoryview] = attrs.Factory(deque)
    out_bytes: int = 0
    closed: bool = False
    rids: set[str] = attrs.Factory(set)
    tokens: int = 0
