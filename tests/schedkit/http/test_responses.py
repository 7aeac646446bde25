"""Whole JSON responses and streamed chunks under the installed uvicorn's httptools protocol:
the one-write path is taken (so an upgrade of uvicorn that moves its private state shows here),
and the bytes on the wire are what the two ASGI sends would have written."""

import asyncio

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from schedkit.http.responses import chunk_writer, json_response


class RecordingTransport(asyncio.Transport):
    """A transport that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def write(self, data) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def set_protocol(self, protocol) -> None:
        pass


def _serve_one(app, request: bytes) -> RecordingTransport:
    async def main() -> RecordingTransport:
        config = Config(app=app, http="httptools", server_header=False, date_header=False)
        config.load()
        protocol = HttpToolsProtocol(config, ServerState(), app_state={})
        transport = RecordingTransport()
        protocol.connection_made(transport)
        protocol.data_received(request)
        for _ in range(100):
            await asyncio.sleep(0)
            if protocol.cycle is None or protocol.cycle.response_complete:
                break
        protocol.connection_lost(None)
        return transport

    return asyncio.run(main())


def test_a_whole_json_response_leaves_in_one_write():
    async def app(scope, receive, send):
        await json_response({"ok": True})(scope, receive, send)

    transport = _serve_one(app, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    assert transport.writes == [
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"
        b'{"ok":true}'
    ]


def test_streamed_chunks_are_written_straight_in_the_chunked_encoding():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        write = chunk_writer(send)
        assert write is not None  # the installed uvicorn's state is where it is expected
        await write(b"data: 1\n\n")
        await write(b"")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    transport = _serve_one(app, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    assert b"".join(transport.writes).endswith(b"9\r\ndata: 1\n\n\r\n0\r\n\r\n")
    assert b"transfer-encoding: chunked" in transport.writes[0]
