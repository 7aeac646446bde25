"""What the request edge reads and says back: a client's message validated against the wire
schema (or the refusal naming what is wrong), refusals cut to a bounded length, outputs split
by client, and warnings logged at most once a second of each kind."""

from __future__ import annotations

import time

import attrs
import msgspec
import structlog

from schedkit.components.io.io_struct import (
    BatchEmbeddingOutput,
    BatchTokenIDOutput,
    ControlReq,
    GenerateReqInput,
    decode_request,
    rid_of,
)
from schedkit.components.io.zmtp import ZmtpMessage

__all__ = [
    "MAX_PROBLEM_CHARS",
    "OutputMessage",
    "RateLimitedWarnings",
    "Refusal",
    "client_message",
    "leading_kind_and_rid",
    "rows",
    "shortened",
]

log = structlog.get_logger("schedkit.components.io.zmq_server")

OutputMessage = BatchTokenIDOutput | BatchEmbeddingOutput
# Refusals are cut to this length (a client that never reads has them queued).
MAX_PROBLEM_CHARS = 1000
# A rid longer than this is invalid (the wire schema's bound on short strings).
_MAX_RID_CHARS = 256
VALID_MESSAGES = "valid messages: GenerateReqInput (kind 'generate'), ControlReq (kind 'control')"


@attrs.define(slots=True, frozen=True)
class Refusal:
    """Why a message is refused, and its rid when it could be read."""

    problem: str
    rid: str | None = None


def client_message(
    message: ZmtpMessage, *, from_req_socket: bool, max_message_bytes: int
) -> GenerateReqInput | ControlReq | Refusal:
    """The request or control message a client sent, or why it is refused."""
    if from_req_socket and message.parts == 2 and not message.first:
        return Refusal(
            "got a REQ socket's envelope (an empty frame, then the message); connect a "
            "DEALER and send each message as one frame"
        )
    if message.parts != 1:
        return Refusal(f"expected one message frame from a DEALER, got {message.parts}")
    if message.oversize:
        return Refusal(
            f"message is {message.oversize} bytes; the limit is {max_message_bytes} bytes "
            "(max_message_bytes)"
        )
    data = message.last
    try:
        return decode_request(data)
    except msgspec.ValidationError as exc:
        return Refusal(f"{exc}; {VALID_MESSAGES}", rid_of(data))
    except msgspec.DecodeError as exc:
        return Refusal(f"{exc}; {VALID_MESSAGES}")
    except RecursionError:
        return Refusal(
            f"message nested too deeply to decode (requests nest 3 levels); {VALID_MESSAGES}"
        )


def _string_at(data: bytes, pos: int) -> tuple[str, int] | None:
    """The msgpack string at ``pos`` of ``data`` and the position after it, or None."""
    if pos >= len(data):
        return None
    head = data[pos]
    if 0xA0 <= head <= 0xBF:  # fixstr
        size, pos = head & 0x1F, pos + 1
    elif head == 0xD9 and pos + 1 < len(data):  # str 8
        size, pos = data[pos + 1], pos + 2
    elif head == 0xDA and pos + 2 < len(data):  # str 16
        size, pos = int.from_bytes(data[pos + 1 : pos + 3], "big"), pos + 3
    else:
        return None
    end = pos + size
    if end > len(data):
        return None
    try:
        return data[pos:end].decode(), end
    except UnicodeDecodeError:
        return None


def leading_kind_and_rid(data: bytes) -> tuple[str, str] | None:
    """A message's ``kind`` and ``rid`` when they are the first two entries of its map (as
    every msgspec or SGLang-style encoder writes a request), read from its first bytes; None
    otherwise (``kind_and_rid`` reads the whole message then). Refusing a client at its limit
    costs microseconds this way, not a skip over its prompt."""
    if not data:
        return None
    head = data[0]
    if 0x82 <= head <= 0x8F:  # fixmap of at least two entries
        pos = 1
    elif head == 0xDE and len(data) > 3 and int.from_bytes(data[1:3], "big") >= 2:
        pos = 3
    elif head == 0xDF and len(data) > 5 and int.from_bytes(data[1:5], "big") >= 2:
        pos = 5
    else:
        return None
    fields = {}
    for _ in range(2):
        key = _string_at(data, pos)
        if key is None:
            return None
        value = _string_at(data, key[1])
        if value is None:
            return None
        fields[key[0]], pos = value
    kind, rid = fields.get("kind"), fields.get("rid")
    if kind is None or rid is None or len(rid) > _MAX_RID_CHARS:
        return None
    return kind, rid


@attrs.define(slots=True)
class RateLimitedWarnings:
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


def shortened(text: str) -> str:
    """``text`` cut in the middle to at most ``MAX_PROBLEM_CHARS`` characters: a refusal
    quotes what it refuses (a field name, a value), which a client makes as long as it likes,
    and the place (``at `$.field```) comes last."""
    if len(text) <= MAX_PROBLEM_CHARS:
        return text
    head, tail = MAX_PROBLEM_CHARS * 3 // 5, MAX_PROBLEM_CHARS * 3 // 10
    return f"{text[:head]}... ({len(text) - head - tail} characters left out) ...{text[-tail:]}"


def rows(msg: OutputMessage, selected: list[int]) -> OutputMessage:
    """``msg`` with only the ``selected`` rows of its per-request columns."""
    n = len(msg.rids)
    fields = {}
    for name in msg.__struct_fields__:
        value = getattr(msg, name)
        if isinstance(value, list) and len(value) == n:
            value = [value[i] for i in selected]
        fields[name] = value
    return type(msg)(**fields)
