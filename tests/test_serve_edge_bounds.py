"""What a real ``schedkit serve`` keeps bounded at its request edge: control messages need the
admin token, idle connections neither lock clients out nor make the loop spin, partial frames
and endless multi-frame messages do not grow it, and a small request is not held up by another
client's flood."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

from schedkit.components.io.io_struct import ControlReq, encode
from schedkit.components.io.zmtp import GREETING, command, frame_header
from schedkit.testing.serving import peak_rss_mib, start_serve
from tests.test_serve_hostile_clients import Client, shut_down, wait_for

DEALER_READY = command(b"READY", {b"Socket-Type": b"DEALER"})


def raw_peer(endpoint: str) -> socket.socket:
    """A plain TCP socket that completed the ZMTP handshake as a DEALER."""
    host, port = endpoint[len("tcp://") :].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(GREETING + DEALER_READY)
    return sock


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # clock ticks (USER_HZ is 100 on Linux)


def started(server: subprocess.Popen, endpoint: str) -> None:
    assert json.loads(server.stdout.readline())["ready"]["requests"] == endpoint


def test_pause_needs_the_admin_token_and_a_connected_pause_ends_with_its_owner():
    server, endpoint = start_serve(admin_token="s3cret")
    outsider, owner, user = Client(endpoint), Client(endpoint), Client(endpoint)
    try:
        started(server, endpoint)
        for kind in ("pause", "continue", "flush"):
            refused = outsider.control(kind)
            assert not refused.ok and "needs the admin token" in refused.message
        outsider.sock.send(encode(ControlReq(type="pause", token="wrong")))
        wait_for([outsider], lambda: outsider.replies)
        wrong = outsider.replies.pop()
        assert not wrong.ok and "got a different one" in wrong.message
        assert outsider.control("get_loads").ok  # needs no token
        owner.sock.send(encode(ControlReq(type="pause", token="s3cret", while_connected=True)))
        wait_for([owner], lambda: owner.replies)
        assert owner.replies.pop().ok
        user.generate("u", [5] * 30, 4)
        user.pump(500)
        assert user.finishes == {}  # paused
        owner.sock.close()  # its pause ends with it
        wait_for([user], lambda: user.finishes == {"u": 1}, timeout=10)
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        stderr = shut_down(server, [outsider, user])
    assert "Traceback" not in stderr and "pause ended" in stderr


def test_a_thousand_idle_connections_neither_lock_a_client_out_nor_spin_the_loop():
    server, endpoint = start_serve(max_open_files=1024)
    idle: list[socket.socket] = []
    client = None
    try:
        started(server, endpoint)
        for _ in range(1000):
            idle.append(raw_peer(endpoint))
        time.sleep(1.0)
        before = cpu_seconds(server.pid)
        time.sleep(1.0)
        assert cpu_seconds(server.pid) - before < 0.3  # a spinning loop burns ~1 s a second
        client = Client(endpoint)
        client.generate("new", [7] * 40, 4)
        wait_for([client], lambda: client.finishes == {"new": 1}, timeout=20)
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        for sock in idle:
            sock.close()
        stderr = shut_down(server, [client] if client else [])
    assert "Traceback" not in stderr


def test_partial_frames_and_endless_multi_frame_messages_keep_serve_under_300_mib():
    server, endpoint = start_serve()
    holders: list[socket.socket] = []
    client = None
    try:
        started(server, endpoint)
        size = (8 << 20) - 1  # the largest frame max_message_bytes lets it hold
        for _ in range(48):  # each sends all of its frame but one byte, and waits
            sock = raw_peer(endpoint)
            sock.sendall(frame_header(size) + bytes(size - 1))
            holders.append(sock)
        framer = raw_peer(endpoint)  # a message whose frames never end
        try:
            for _ in range(100):
                framer.sendall(b"\x01\x00" * 65536)
        except OSError:
            pass  # closed by the server
        client = Client(endpoint)
        client.generate("after", [7] * 40, 4)
        wait_for([client], lambda: client.finishes == {"after": 1}, timeout=30)
        peak = peak_rss_mib(server.pid)
        assert peak < 300, f"serve peaked at {peak:.0f} MiB"
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        for sock in holders:
            sock.close()
        stderr = shut_down(server, [client] if client else [])
    assert "Traceback" not in stderr
    assert "over max_partial_bytes" in stderr and "more than 64 frames" in stderr
