"""ConnectionTable alone, over real loopback sockets: the connection cap with idle eviction and
refusal, the total budget on partial frames, and the budgets on unsent output."""

from __future__ import annotations

import errno
import socket
import time
import types

import pytest

from schedkit.components.io import edge_connections
from schedkit.components.io.edge_connections import Connection, ConnectionTable
from schedkit.components.io.edge_listen import listen
from schedkit.components.io.zmtp import GREETING, command, frame_header

DEALER_READY = command(b"READY", {b"Socket-Type": b"DEALER"})


@pytest.fixture
def make_table():
    tables, peers = [], []

    def make_table(busy=lambda conn: False, **limits):
        listener, endpoint = listen("tcp://127.0.0.1:0", backlog=16)
        closed: list[tuple[Connection, str]] = []
        args = {
            "max_connections": 8,
            "max_frame_bytes": 1 << 20,
            "max_frames": 4,
            "max_partial_bytes": 4 << 20,
            "max_queued_messages": 100,
            "max_queued_bytes": 1 << 20,
            "max_queued_total_bytes": 4 << 20,
            "handshake_timeout": 10.0,
            **limits,
        }
        table = ConnectionTable(
            listener=listener,
            on_close=lambda conn, why: closed.append((conn, why)),
            is_busy=busy,
            **args,
        )
        tables.append(table)
        port = int(endpoint.rsplit(":", 1)[1])

        def peer(handshake: bool = True) -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", port))
            if handshake:
                sock.sendall(GREETING + DEALER_READY)
            peers.append(sock)
            return sock

        return table, peer, closed

    yield make_table
    for sock in peers:
        sock.close()
    for table in tables:
        table.close_all()


def settle(table: ConnectionTable, until, timeout: float = 5.0) -> list:
    messages, deadline = [], time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        messages += table.read(table.poll(0.02), 1 << 20)
    return messages


def test_at_the_cap_the_longest_idle_connection_makes_room_and_busy_ones_refuse_newcomers(
    make_table,
):
    busy: set[Connection] = set()
    table, peer, closed = make_table(busy=lambda conn: conn in busy, max_connections=2)
    peer()
    settle(table, lambda: len(table) == 1)
    first = next(iter(table))
    peer()
    settle(table, lambda: len(table) == 2)
    peer()  # the first, idle longest, goes
    settle(table, lambda: closed)
    assert closed[0][0] is first and closed[0][1].startswith("evicted")
    assert len(table) == 2 and table.evicted == 1
    busy.update(table)
    peer()  # everyone is busy: refused
    settle(table, lambda: table.refused == 1)
    assert len(table) == 2 and len(closed) == 1


def test_partial_frames_over_the_total_budget_close_the_largest_holder(make_table):
    table, peer, closed = make_table(max_partial_bytes=1 << 20)
    small, large = peer(), peer()
    small.sendall(frame_header(100_000) + bytes(50_000))
    settle(table, lambda: table.partial_bytes > 0)
    large.sendall(frame_header(1_000_000) + bytes(999_999))  # 1,050,013 held in all
    settle(table, lambda: closed)
    assert "over max_partial_bytes" in closed[0][1]
    assert closed[0][0].peer.endswith(str(large.getsockname()[1]))
    assert table.partial_bytes < 100_000 + 64 and len(table) == 1


def test_a_peer_that_never_reads_is_closed_once_its_queue_is_over_budget(make_table):
    table, peer, closed = make_table(max_queued_bytes=1 << 20)
    reader = peer()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    settle(table, lambda: len(table) == 1)
    conn = next(iter(table))
    sent = 0
    while not conn.closed:
        assert sent < 10_000, "never closed"
        table.send(conn, (bytes(10_000),))
        sent += 1
    assert closed[0][1].startswith("too slow") and table.queued_bytes == 0


def test_a_connection_without_a_handshake_is_closed_after_the_timeout(make_table):
    table, peer, closed = make_table(handshake_timeout=0.2)
    peer(handshake=False)
    settle(table, lambda: closed, timeout=3.0)
    assert "no handshake within 0.2 s" in closed[0][1]


class OutOfDescriptorsOnce:
    """A listening socket whose first accept fails as when the process has no descriptor
    left (EMFILE); the OS cannot be made to do that to one test without starving the rest."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.accepts = sock, 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self):
        self.accepts += 1
        if self.accepts == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        return self.sock.accept()

    def close(self) -> None:
        self.sock.close()


def test_out_of_descriptors_it_stops_accepting_for_a_while_instead_of_spinning(monkeypatch):
    # The table's clock stands still until moved on: how many polls fall within the pause
    # is then up to the test, not to how long the machine's load holds this process.
    now = [1000.0]
    monkeypatch.setattr(edge_connections, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    sock, endpoint = listen("tcp://127.0.0.1:0", backlog=4)
    listener = OutOfDescriptorsOnce(sock)
    table = ConnectionTable(
        listener=listener,
        on_close=lambda conn, why: None,
        is_busy=lambda conn: False,
        max_connections=8,
        max_frame_bytes=1 << 20,
        max_frames=4,
        max_partial_bytes=4 << 20,
        max_queued_messages=100,
        max_queued_bytes=1 << 20,
        max_queued_total_bytes=4 << 20,
        handshake_timeout=10.0,
    )
    peer = socket.create_connection(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])))
    try:
        deadline = time.monotonic() + 10
        while not listener.accepts:  # the pending connection: accept fails
            assert time.monotonic() < deadline, "the connection never reached the backlog"
            table.poll(0.1)
        now[0] += edge_connections._ACCEPT_PAUSE - 0.001
        for _ in range(100):
            table.poll(0)
        assert listener.accepts == 1  # the backlog stays readable, and is not polled
        now[0] += 0.001  # the pause is over
        settle(table, lambda: len(table) == 1)
        assert listener.accepts >= 2
    finally:
        peer.close()
        table.close_all()


def test_tcp_connections_are_accepted_with_nagle_off():
    listener, endpoint = listen("tcp://127.0.0.1:0", 8)
    port = int(endpoint.rsplit(":", 1)[1])
    with listener, socket.create_connection(("127.0.0.1", port)):
        deadline = time.monotonic() + 10
        while True:
            try:
                accepted, _ = listener.accept()
                break
            except BlockingIOError:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
