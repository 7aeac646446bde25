"""ZMTP 3 (the ZeroMQ wire protocol, NULL mechanism) as a ROUTER speaks it to DEALER and REQ
peers: the greeting, the READY handshake, PING/PONG, and message framing, parsed from a byte
stream that arrives in pieces.

The reader holds at most one partial frame: a frame larger than ``max_frame_bytes`` is skipped
as it arrives (its size is reported, its bytes are never kept), and the frames of one message
are counted but only the first and the last are kept. A peer that breaks the protocol (a bad
greeting, a mechanism other than NULL, a socket type a ROUTER does not talk to, a command
larger than ``MAX_COMMAND_BYTES``, more than ``max_frames`` frames in a message) is reported
through ``error``, after which the connection is to be closed. Specification: ZMTP 3.0/3.1
(rfc.zeromq.org specs 23 and 37).
"""

from __future__ import annotations

import attrs

__all__ = ["GREETING", "GREETING_BYTES", "MAX_COMMAND_BYTES", "ZmtpMessage", "ZmtpReader"]

GREETING_BYTES = 64
# Signature (0xFF, 8 padding bytes, 0x7F), version 3.0, mechanism NULL, as-server 0, filler.
GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)
# READY carries a few short properties (socket type, routing id up to 255 bytes, metadata).
MAX_COMMAND_BYTES = 8192
_MORE, _LONG, _COMMAND = 1, 2, 4
# The socket types a ROUTER talks to (libzmq's compatibility table).
PEER_SOCKET_TYPES = frozenset({b"DEALER", b"REQ", b"ROUTER"})


def frame_header(size: int, flags: int = 0) -> bytes:
    """The flags byte and size of a frame of ``size`` bytes."""
    if size > 255:
        return bytes((flags | _LONG,)) + size.to_bytes(8, "big")
    return bytes((flags, size))


def command(name: bytes, properties: dict[bytes, bytes] | None = None) -> bytes:
    """A command frame: ``name`` and its properties (each a 1-byte-length name and a
    4-byte-length value)."""
    body = bytes((len(name),)) + name
    for key, value in (properties or {}).items():
        body += bytes((len(key),)) + key + len(value).to_bytes(4, "big") + value
    return frame_header(len(body), _COMMAND) + body


READY = command(b"READY", {b"Socket-Type": b"ROUTER"})


def encode_message(frames: tuple[bytes, ...]) -> bytes:
    """The wire bytes of a message of ``frames`` (every frame but the last flagged MORE)."""
    out = bytearray()
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        out += frame_header(len(frame), _MORE if i < last else 0)
        out += frame
    return bytes(out)


def _properties(body: bytes | bytearray) -> dict[bytes, bytes] | None:
    """The properties of a command body after its name; None when they are malformed."""
    props, pos, n = {}, 0, len(body)
    while pos < n:
        key_len = body[pos]
        key_end = pos + 1 + key_len
        if key_end + 4 > n:
            return None
        value_len = int.from_bytes(body[key_end : key_end + 4], "big")
        value_end = key_end + 4 + value_len
        if value_end > n:
            return None
        props[bytes(body[pos + 1 : key_end]).lower()] = bytes(body[key_end + 4 : value_end])
        pos = value_end
    return props


@attrs.define(slots=True)
class ZmtpMessage:
    """One whole message: its first and last frames (the same for one frame; b"" for a
    frame that was skipped), how many frames it had and the largest frame over the limit
    (0 if none)."""

    first: bytes
    last: bytes
    parts: int
    oversize: int


@attrs.define(slots=True)
class ZmtpReader:
    """Turns the bytes a peer sends into messages; see the module docstring."""

    max_frame_bytes: int
    max_frames: int
    buffer: bytearray = attrs.Factory(bytearray)
    greeted: bool = False
    ready: bool = False
    peer_socket_type: bytes = b""
    error: str | None = None
    # Bytes the peer is to be sent back (PONG answers to PING).
    replies: list[bytes] = attrs.Factory(list)
    _skip: int = 0
    _skip_more: bool = False
    _parts: int = 0
    _first: bytes = b""
    _oversize: int = 0

    @property
    def held(self) -> int:
        """Bytes received and not yet part of a whole frame."""
        return len(self.buffer)

    def feed(self, data: bytes) -> list[ZmtpMessage]:
        """Take the next bytes from the peer; the messages they completed."""
        messages: list[ZmtpMessage] = []
        if self._skip and not self.buffer:  # the bytes of a skipped frame are never copied
            taken = min(self._skip, len(data))
            self._skip -= taken
            if not self._skip:
                self._frame_end(b"", self._skip_more, messages)
            data = memoryview(data)[taken:]
        self.buffer += data
        if self.error is None:
            self._parse(messages)
        return messages

    def _parse(self, messages: list[ZmtpMessage]) -> None:
        buf = self.buffer
        n, pos = len(buf), 0
        if self._skip:
            pos = min(self._skip, n)
            self._skip -= pos
            if not self._skip:
                self._frame_end(b"", self._skip_more, messages)
        elif not self.greeted:
            if not self._greeting():
                return
            pos = GREETING_BYTES
        while self.error is None and n - pos >= 2:
            flags = buf[pos]
            if flags & ~(_MORE | _LONG | _COMMAND):
                self.error = f"frame flags {flags:#04x} have reserved bits set"
                break
            if flags & _LONG:
                if n - pos < 9:
                    break
                size, start = int.from_bytes(buf[pos + 1 : pos + 9], "big"), pos + 9
            else:
                size, start = buf[pos + 1], pos + 2
            if flags & _COMMAND:
                if size > MAX_COMMAND_BYTES:
                    self.error = f"a {size}-byte command (at most {MAX_COMMAND_BYTES})"
                    break
                if n - start < size:
                    break
                self._command(buf[start : start + size])
                pos = start + size
                continue
            if not self.ready:
                self.error = "a message frame before the READY handshake"
                break
            if self._parts >= self.max_frames:
                self.error = f"a message of more than {self.max_frames} frames"
                break
            more = bool(flags & _MORE)
            if size > self.max_frame_bytes:  # skipped as it arrives, never kept
                self._parts += 1
                self._oversize = max(self._oversize, size)
                taken = min(size, n - start)
                pos = start + taken
                self._skip, self._skip_more = size - taken, more
                if not self._skip:
                    self._frame_end(b"", more, messages)
                continue
            if n - start < size:
                break
            self._parts += 1
            with memoryview(buf) as view:  # one copy of the frame
                body = view[start : start + size].tobytes()
            self._frame_end(body, more, messages)
            pos = start + size
        del buf[:pos]

    def _greeting(self) -> bool:
        buf = self.buffer
        if buf[:1] and buf[0] != 0xFF:
            self.error = "not a ZMTP peer (its greeting does not start with 0xFF)"
            return False
        if len(buf) < GREETING_BYTES:
            return False
        if not buf[9] & 1:
            self.error = "not a ZMTP 3 greeting"
        elif buf[10] < 3:
            self.error = f"ZMTP version {buf[10]} (this server speaks 3)"
        elif bytes(buf[12:32]).rstrip(b"\0") != b"NULL":
            mechanism = bytes(buf[12:32]).rstrip(b"\0").decode("ascii", "replace")
            self.error = f"security mechanism {mechanism!r} (this server speaks NULL)"
        self.greeted = self.error is None
        return self.greeted

    def _command(self, body: bytearray) -> None:
        name_len = body[0] if body else 0
        name, rest = bytes(body[1 : 1 + name_len]), body[1 + name_len :]
        if name == b"READY" and not self.ready:
            props = _properties(rest)
            kind = (props or {}).get(b"socket-type", b"")
            if props is None:
                self.error = "a malformed READY command"
            elif kind not in PEER_SOCKET_TYPES:
                self.error = f"socket type {kind!r} (a ROUTER talks to DEALER and REQ)"
            else:
                self.ready, self.peer_socket_type = True, kind
        elif name == b"READY":
            self.error = "a second READY command"
        elif name == b"PING" and len(rest) >= 2:
            self.replies.append(_pong(bytes(rest[2:18])))
        elif name == b"ERROR":
            self.error = "the peer reported an error"
        # Other commands (PONG, SUBSCRIBE, CANCEL) mean nothing to a ROUTER: ignored.

    def _frame_end(self, body: bytes, more: bool, messages: list[ZmtpMessage]) -> None:
        if self._parts == 1:
            self._first = body
        if more:
            return
        messages.append(ZmtpMessage(self._first, body, self._parts, self._oversize))
        self._parts, self._first, self._oversize = 0, b"", 0


def _pong(context: bytes) -> bytes:
    """A PONG command echoing a PING's context (up to 16 bytes)."""
    body = b"\x04PONG" + context
    return frame_header(len(body), _COMMAND) + body
