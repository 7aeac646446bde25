"""The front end's ZMTP DEALER against a real libzmq ROUTER and against a raw peer that breaks
the protocol: messages both ways, PING answered, and every way the link ends reported."""

from __future__ import annotations

import asyncio
import socket

import pytest
import zmq

from schedkit.components.io.zmtp import GREETING, READY, frame_header
from schedkit.http.scheduler_link import SchedulerLink, connect_endpoint

# A PING command (ZMTP 3.1): its name, a TTL and a context the PONG echoes.
PING = frame_header(10, 4) + b"\x04PING\x00\x0actx"


async def _until(condition, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.002)


def test_endpoints_of_another_kind_or_with_nothing_listening_are_refused():
    with pytest.raises(ValueError, match=r"inproc://x.*ipc://PATH or tcp://HOST:PORT"):
        connect_endpoint("inproc://x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(ConnectionError, match=f"tcp://127.0.0.1:{port}"):
            connect_endpoint(f"tcp://127.0.0.1:{port}")


def test_messages_both_ways_with_a_libzmq_router_then_its_close_is_reported():
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:0")
    endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)

    async def run() -> tuple[list[list[bytes]], list[bytes], list[str]]:
        got, lost, received = [], [], []
        link = SchedulerLink(endpoint, got.append, lost.append)
        link.open(asyncio.get_running_loop())
        for i in range(3):  # sent before the handshake: they wait for it, in order
            link.send(b"m%d" % i)
        link.send(b"x" * 300)  # a long frame

        def read() -> bool:
            while router.poll(0):
                received.append(router.recv_multipart())
            return len(received) == 4

        await _until(read)
        peer = received[0][0]
        router.send_multipart([peer, b"reply"])
        router.send_multipart([peer, b"y" * 70_000])
        await _until(lambda: len(got) == 2)
        router.close()
        await _until(lambda: lost)
        with pytest.raises(ConnectionError):
            link.send(b"late")
        return received, got, lost

    received, got, lost = asyncio.run(run())
    assert [frames[1] for frames in received] == [b"m0", b"m1", b"m2", b"x" * 300]
    assert got == [b"reply", b"y" * 70_000]
    assert lost == ["the scheduler closed the connection"]


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        (frame_header(2, 1) + b"ab" + frame_header(1) + b"c", "more than 1 frames"),
        (b"\xff" + bytes(7), "broke the protocol: frame flags 0xff"),
    ],
)
def test_a_peer_breaking_the_protocol_ends_the_link_after_answering_ping(sent, reason):
    async def run() -> tuple[list[bytes], list[str], bytes]:
        got, lost, seen = [], [], bytearray()

        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(GREETING + READY + PING)
            writer.write(frame_header(2) + b"ok" + sent)
            while data := await reader.read(65536):
                seen.extend(data)
            writer.close()

        server = await asyncio.start_server(peer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        link = SchedulerLink(f"tcp://127.0.0.1:{port}", got.append, lost.append)
        link.open(asyncio.get_running_loop())
        await _until(lambda: lost)
        await _until(lambda: b"PONGctx" in seen)
        server.close()
        return got, lost, bytes(seen)

    got, lost, seen = asyncio.run(run())
    assert got == [b"ok"]
    assert len(lost) == 1 and reason in lost[0], lost
    assert seen.startswith(GREETING[:10])
    assert b"\x04PONGctx" in seen
