"""A JSON response as an ASGI callable: the body encoded once with msgspec, its two headers
built once, then two sends."""

from __future__ import annotations

import msgspec
from starlette.types import Receive, Scope, Send

__all__ = ["JsonResponse", "json_response"]

_encode = msgspec.json.Encoder().encode
_CONTENT_TYPE = (b"content-type", b"application/json")


class JsonResponse:
    """``body`` (already JSON) sent with ``status``, its length and ``headers``."""

    __slots__ = ("body", "headers", "status_code")

    def __init__(self, body: bytes, status: int = 200, headers: dict | None = None) -> None:
        self.body = body
        self.status_code = status
        self.headers = [_CONTENT_TYPE, (b"content-length", b"%d" % len(body))]
        if headers:
            self.headers += [(k.lower().encode(), str(v).encode()) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.headers}
        )
        await send({"type": "http.response.body", "body": self.body})


def json_response(content: object, status: int = 200, headers: dict | None = None) -> JsonResponse:
    """A JSON response encoded with msgspec."""
    return JsonResponse(_encode(content), status, headers)
