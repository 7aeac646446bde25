"""ZmtpReader alone, fed the bytes a libzmq DEALER sends (recorded from a real socket)."""

from __future__ import annotations

import socket

import zmq

from schedkit.components.io.zmtp import GREETING, READY, ZmtpReader, command, encode_message


def dealer_bytes(*messages: list[bytes]) -> bytes:
    """What a libzmq DEALER sends a ROUTER that greets it: its greeting, READY and messages."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 1000)
        dealer.connect(f"tcp://127.0.0.1:{listener.getsockname()[1]}")
        for message in messages:
            dealer.send_multipart(message)
        peer, _ = listener.accept()
        peer.sendall(GREETING + READY)
        peer.settimeout(2.0)
        received = b""
        want = 64 + len(READY) - 2  # at least the greeting and a READY
        while len(received) < want + sum(len(f) + 2 for m in messages for f in m):
            chunk = peer.recv(65536)
            if not chunk:
                break
            received += chunk
        dealer.close()
        peer.close()
        return received


def test_a_libzmq_dealer_handshakes_and_its_messages_arrive_byte_by_byte():
    data = dealer_bytes([b"hello"], [b"a", b"b"])
    reader = ZmtpReader(max_frame_bytes=1 << 20, max_frames=8)
    messages = []
    for i in range(len(data)):
        messages += reader.feed(data[i : i + 1])
    assert reader.error is None and reader.peer_socket_type == b"DEALER"
    assert [(m.first, m.last, m.parts) for m in messages] == [
        (b"hello", b"hello", 1),
        (b"a", b"b", 2),
    ]
    assert reader.held == 0


def ready_reader(**limits: int) -> ZmtpReader:
    reader = ZmtpReader(**{"max_frame_bytes": 1024, "max_frames": 4, **limits})
    reader.feed(GREETING + command(b"READY", {b"Socket-Type": b"DEALER"}))
    assert reader.ready
    return reader


def test_a_frame_over_the_limit_is_skipped_as_it_arrives():
    reader = ready_reader()
    body = bytes(100_000)
    wire = encode_message((body,))
    messages = []
    for i in range(0, len(wire), 4096):
        messages += reader.feed(wire[i : i + 4096])
        assert reader.held < 4096 + 9
    assert [(m.parts, m.oversize, m.last) for m in messages] == [(1, 100_000, b"")]


def test_too_many_frames_a_bad_greeting_or_peer_type_are_errors():
    reader = ready_reader()
    reader.feed(b"\x01\x00" * 5)
    assert reader.error == "a message of more than 4 frames"
    plain = ZmtpReader(max_frame_bytes=1024, max_frames=4)
    plain.feed(b"GET / HTTP/1.1\r\n")
    assert "not a ZMTP peer" in plain.error
    pub = ZmtpReader(max_frame_bytes=1024, max_frames=4)
    pub.feed(GREETING + command(b"READY", {b"Socket-Type": b"PUB"}))
    assert "socket type b'PUB'" in pub.error


def test_a_ping_is_answered_with_its_context():
    reader = ready_reader()
    reader.feed(command(b"PING")[:1] + bytes((4 + 1 + 2 + 3,)) + b"\x04PING\x00\x0actx")
    assert reader.replies == [b"\x04\x08\x04PONGctx"]
