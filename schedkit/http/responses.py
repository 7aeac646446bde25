"""A JSON response as an ASGI callable: the body encoded once with msgspec, its two headers
built once. Under uvicorn's httptools protocol (the front end's server) a response with no
other headers is written in one write of status line, headers and body, where two ASGI sends
cost two writes; under any other server it is the two sends."""

from __future__ import annotations

import msgspec
from starlette.types import Receive, Scope, Send

try:
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle
except ImportError:  # a uvicorn without its httptools protocol: always the ASGI sends
    STATUS_LINE, RequestResponseCycle = {}, None

__all__ = ["JsonResponse", "chunk_writer", "json_response", "write_whole"]

_encode = msgspec.json.Encoder().encode
_CONTENT_TYPE = (b"content-type", b"application/json")
_JSON_HEAD = b"content-type: application/json\r\ncontent-length: "


class JsonResponse:
    """``body`` (already JSON) sent with ``status``, its length and ``headers``."""

    __slots__ = ("body", "extra", "status_code")

    def __init__(self, body: bytes, status: int = 200, headers: dict | None = None) -> None:
        self.body = body
        self.status_code = status
        self.extra = (
            [(k.lower().encode(), str(v).encode()) for k, v in headers.items()] if headers else None
        )

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """The response's headers as ASGI sends them."""
        headers = [_CONTENT_TYPE, (b"content-length", b"%d" % len(self.body))]
        return headers + self.extra if self.extra else headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self.body
        if self.extra is None and write_whole(
            send, self.status_code, b"%s%d\r\n" % (_JSON_HEAD, len(body)), body
        ):
            return
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.headers}
        )
        await send({"type": "http.response.body", "body": body})


def json_response(content: object, status: int = 200, headers: dict | None = None) -> JsonResponse:
    """A JSON response encoded with msgspec."""
    return JsonResponse(_encode(content), status, headers)


def write_whole(send: Send, status: int, header_lines: bytes, body: bytes) -> bool:
    """Write a whole response (``header_lines``: each ``name: value\\r\\n``, neither
    ``connection`` nor ``transfer-encoding``) in one write when ``send`` is the ASGI send of
    uvicorn's httptools protocol, keeping its bookkeeping as its own two sends would; False
    (nothing written) under any other server or once the response started."""
    cycle = getattr(send, "__self__", None)
    if type(cycle) is not RequestResponseCycle:
        return False
    try:  # the cycle's private state, all read before any is changed
        if (
            cycle.response_started
            or cycle.default_headers
            or cycle.flow.write_paused
            or cycle.scope["method"] == "HEAD"
        ):
            return False
        disconnected, keep_alive, transport = cycle.disconnected, cycle.keep_alive, cycle.transport
        message_event, on_response = cycle.message_event, cycle.on_response
        status_line = STATUS_LINE[status]
    except (AttributeError, KeyError):  # a uvicorn that keeps it otherwise: the ASGI sends
        return False
    if disconnected:
        return True  # as uvicorn's send: nothing to write to
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    close = b"" if keep_alive else b"connection: close\r\n"
    transport.write(b"".join((status_line, header_lines, close, b"\r\n", body)))
    cycle.response_complete = True
    message_event.set()
    if not keep_alive:
        transport.close()
    on_response()
    return True


def chunk_writer(send: Send):
    """For a response streamed in chunks under uvicorn's httptools protocol, started through
    ``send``: a coroutine function writing one body chunk in the chunked encoding straight to
    the transport (waiting while the transport's buffer is full, as uvicorn's send does); None
    under any other server, whose ``send`` then takes each chunk."""
    cycle = getattr(send, "__self__", None)
    if type(cycle) is not RequestResponseCycle:
        return None
    try:
        if not cycle.response_started or cycle.response_complete or not cycle.chunked_encoding:
            return None
        flow, transport = cycle.flow, cycle.transport
    except AttributeError:  # a uvicorn that keeps its state otherwise: ``send`` takes chunks
        return None

    async def write(chunk: bytes) -> None:
        if flow.write_paused and not cycle.disconnected:
            await flow.drain()
        if not cycle.disconnected and chunk:
            transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))

    return write
