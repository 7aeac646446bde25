"""The front-end process: uvicorn serving ``build_app`` with connection-level guards.

uvicorn bounds idle keep-alive connections; what it leaves open, ``GuardedProtocol`` closes:
past ``max_connections`` a new connection gets ``503`` with ``Retry-After`` and is closed;
request headers must arrive within ``header_timeout`` seconds (``408``) and within
``max_header_bytes`` (``431``, however the bytes are split into reads), so a client dribbling
headers (slowloris) or sending endless ones holds a connection for a bounded time and memory;
the body must arrive within ``body_timeout`` seconds of the headers (``408``), timed here so
that a body sent with its headers (nearly every request) costs no timer. A request that is not
HTTP/1.1 (a bad request line, header or body framing) gets a JSON ``400`` naming what is
valid; upgrades (WebSocket, h2c) are not served, and such a request is answered as plain
HTTP/1.1. A lost connection calls the
``schedkit.on_disconnect`` callable a route may put in its request's scope, so that a route
waiting for its request learns of it without a task of its own reading ``receive``.

Run as ``python -m schedkit.http`` with an ``HttpConfig`` as JSON on standard input; prints
``{"http": "http://HOST:PORT"}`` once listening.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import socket
import sys

import msgspec
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from schedkit.http.app import build_app
from schedkit.http.config import HttpConfig, Limits

__all__ = ["GuardedProtocol", "main", "serve"]


def _reply(status: str, message: str, extra: str = "") -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "connection_error",
                "param": None,
                "code": int(status.split()[0]),
            }
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"{extra}connection: close\r\n\r\n"
    )
    return head.encode() + body


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a connection limit and header deadline and size."""

    limits = Limits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        self._header_bytes = 0
        self._header_tail = b""
        self._in_headers = True
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_body = False
        self._body_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > limits.max_connections:
            message = f"over {limits.max_connections} connections (max_connections); retry later"
            retry = f"retry-after: {limits.retry_after_seconds}\r\n"
            transport.write(_reply("503 Service Unavailable", message, retry))
            transport.close()
            return
        self._start_header_timer()

    def _start_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.limits.header_timeout, self._header_late)

    def _header_late(self) -> None:
        self._header_timer = None
        if self._in_headers and not self.transport.is_closing():
            message = f"request headers not received within {self.limits.header_timeout:g} s"
            self.transport.write(_reply("408 Request Timeout", message))
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._in_headers:
            seen = self._header_bytes
            if seen + self._header_length(data) > self.limits.max_header_bytes:
                message = f"request headers over {self.limits.max_header_bytes} bytes"
                self.transport.write(_reply("431 Request Header Fields Too Large", message))
                self.transport.close()
                return
            self._header_bytes = seen + len(data)
            self._header_tail = data[-3:]
        super().data_received(data)
        # Timers only for a request left incomplete: one that arrives whole costs none.
        if self._in_headers and self._header_bytes and self._header_timer is None:
            if not self.transport.is_closing():
                self._start_header_timer()
        elif self._in_body and self._body_timer is None:
            self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_late)

    def _body_late(self) -> None:
        self._body_timer = None
        if not self._in_body or self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            message = f"request body not received within {self.limits.body_timeout:g} s"
            self.transport.write(_reply("408 Request Timeout", message))
        self.transport.close()

    def _header_length(self, data: bytes) -> int:
        """The bytes of ``data`` that belong to the request's headers: up to the blank line
        that ends them (found even when it straddles two reads), or all of it."""
        if not self._header_bytes:
            end = data.find(b"\r\n\r\n")
            return len(data) if end < 0 else end + 4
        tail = self._header_tail
        end = (tail + data).find(b"\r\n\r\n")
        return len(data) if end < 0 else end + 4 - len(tail)

    def send_400_response(self, msg: str) -> None:
        """The answer to bytes the HTTP parser refused, as JSON like every other error."""
        message = (
            "not a valid HTTP/1.1 request: send a request line, header lines and a blank line, "
            "then a body framed by one Content-Length or by Transfer-Encoding: chunked (not both)"
        )
        self.transport.write(_reply("400 Bad Request", message))
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._in_body = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_headers = True
        self._header_bytes = 0
        self._in_body = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        for name in ("_header_timer", "_body_timer"):
            timer = getattr(self, name, None)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            on_disconnect = cycle.scope.get("schedkit.on_disconnect")
            if on_disconnect is not None:
                on_disconnect()


def serve(config: HttpConfig, ready=None) -> None:
    """Serve until SIGINT/SIGTERM; ``ready(url)`` is called once listening."""
    app, engine = build_app(config)
    limits = config.limits
    GuardedProtocol.limits = limits
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    sock.listen(4096)
    sock.set_inheritable(True)
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if family == socket.AF_INET6 else config.host
    uv_config = uvicorn.Config(
        app,
        http=GuardedProtocol,
        loop="uvloop" if _has("uvloop") else "asyncio",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=int(max(1, limits.keep_alive_timeout)),
        h11_max_incomplete_event_size=limits.max_header_bytes,
        ws="none",  # no WebSocket routes: an upgrade request is served as plain HTTP
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )
    server = uvicorn.Server(uv_config)
    url = f"http://{host}:{port}"

    parent = os.getppid()

    async def run() -> None:
        engine.start()  # a scheduler that is not there: a one-line error, not the lifespan's
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            watch = asyncio.ensure_future(_stop_when_orphaned(server, parent))
            task.add_done_callback(lambda _: watch.cancel())
            # What startup made (modules, the app) lives as long as the process: out of the
            # collector's generations, a full collection while serving (a pause every
            # request waits through) walks only what requests made.
            gc.collect()
            gc.freeze()
            if ready is not None:
                ready(url)
        await task

    asyncio.run(run()) if not _has("uvloop") else _run_uvloop(run)


async def _stop_when_orphaned(server: uvicorn.Server, parent: int) -> None:
    """Stop serving once the process that started this one has gone (killed, say, with no
    chance to stop its front end), instead of holding the port with no scheduler behind it."""
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    print(
        "schedkit http: the process that started this front end has ended; stopping",
        file=sys.stderr,
    )
    server.should_exit = True


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _run_uvloop(run) -> None:
    import uvloop

    uvloop.run(run())


def main() -> int:
    """``python -m schedkit.http``: read the config from stdin and serve."""
    try:
        config = msgspec.json.decode(sys.stdin.buffer.read(), type=HttpConfig)
    except msgspec.DecodeError as exc:
        print(f"schedkit http: bad configuration on stdin: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    def ready(url: str) -> None:
        print(json.dumps({"http": url}), flush=True)

    try:
        serve(config, ready)
    except ConnectionError as exc:
        print(f"schedkit http: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"schedkit http: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr
        )
        return 2
    except ValueError as exc:
        print(f"schedkit http: {exc}", file=sys.stderr)
        return 2
    return 0
