"""The replay ROUTER against hostile or careless loopback clients: a routing id chosen to collide
with the next automatic one, clients that ask and never read, clients that ask too often."""

from __future__ import annotations

import subprocess
import sys
import time

import zmq
from structlog.testing import capture_logs

from schedkit.kv_events import (
    GapFilled,
    HistoryLost,
    KvEventsConfig,
    KvEventSubscriber,
    ZmqEventPublisher,
)
from schedkit.kv_events.replay import END_SEQ
from tests.schedkit.kv_events.helpers import batch, config, poll_until, seqs, wait_live

# A publisher with a replay socket, alone in a fresh process (libzmq aborts the whole process
# when two peers of a ROUTER end up with one routing id). It prints its replay endpoint and
# runs until its stdin closes.
PUBLISHER = """
import sys
from schedkit.kv_events import BlockStored, KVEventBatch, KvEventsConfig, ZmqEventPublisher
pub = ZmqEventPublisher(KvEventsConfig(
    endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", heartbeat_interval=0))
for i in range(3):
    pub.publish(KVEventBatch(float(i), [BlockStored([i], None, [i], 1, None, "GPU")]))
pub.flush()
print("replay_endpoint", pub.replay_endpoint, flush=True)
sys.stdin.read()
pub.shutdown()
"""

# Unseeded, libc's rand() makes every process's first ROUTER number its anonymous peers
# b"\\0" + 0x6b8b4567, 0x6b8b4568, ...
PREDICTED_IDS = [b"\x00" + (0x6B8B4567 + k).to_bytes(4, "big") for k in range(8)]


def dealer(endpoint: str, routing_id: bytes | None = None, **options: int) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if routing_id is not None:
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name), value)
    sock.connect(endpoint)
    return sock


def replay(sock: zmq.Socket, start: int, timeout: float = 5.0) -> list[list[bytes]]:
    """Ask for a replay from ``start``; every reply up to and including the end marker."""
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    replies = []
    deadline = time.monotonic() + timeout
    while not replies or replies[-1][2] != END_SEQ:
        left_ms = int((deadline - time.monotonic()) * 1000)
        assert left_ms > 0 and sock.poll(left_ms), f"no end marker in {timeout}s: {replies}"
        replies.append(sock.recv_multipart())
    return replies


def test_a_client_taking_the_next_automatic_routing_id_does_not_kill_the_publisher():
    survives_a_client_taking_the_next_automatic_routing_id(PUBLISHER)


def survives_a_client_taking_the_next_automatic_routing_id(publisher: str) -> None:
    """Run the ``publisher`` script (three batches, seqs 0-2, then it prints its replay
    endpoint) in a fresh process; clients take the ids its ROUTER would give next, then an
    anonymous one asks for a replay: the publisher must answer it and live on."""
    proc = subprocess.Popen(
        [sys.executable, "-c", publisher],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    clients = []
    try:
        line = ""
        while not line.startswith("replay_endpoint "):  # after the publisher's log lines
            line = proc.stdout.readline()
            assert line, "the publisher exited before it was ready"
        endpoint = line.split()[1]
        for routing_id in PREDICTED_IDS:  # each connected and answered before the next
            clients.append(dealer(endpoint, routing_id))
            assert len(replay(clients[-1], 0)) == 4
        clients.append(dealer(endpoint))  # anonymous: gets the next automatic id
        replies = replay(clients[-1], 1)
        assert proc.poll() is None, f"the publisher died with status {proc.returncode}"
        assert [int.from_bytes(f[2], "big", signed=True) for f in replies] == [1, 2, -1]
    finally:
        for sock in clients:
            sock.close()
        proc.stdin.close()
        status = proc.wait(10)
        proc.stdout.close()
    assert status == 0


def stalled_client(endpoint: str, requests: int) -> zmq.Socket:
    """A client that asks for ``requests`` replays of everything and never reads."""
    sock = dealer(endpoint, RCVHWM=1, RCVBUF=4096)
    for _ in range(requests):
        sock.send_multipart([b"", (0).to_bytes(8, "big")])
    return sock


def test_replayers_that_never_read_starve_no_one(closing):
    # A client's queue takes one whole replay of the ring (so that one that reads is never
    # taken for stalled): the first of the 16 fills it, the second would block.
    pub = closing(ZmqEventPublisher(config(replay=True, buffer_steps=3000)))
    for i in range(3000):  # ~9 MB
        pub.publish(batch(i, tokens=1000))
    pub.flush()
    server = pub._replay
    with capture_logs() as logs:
        stalled = stalled_client(pub.replay_endpoint, 16)
        try:
            # The 16 requests read (two taken, fourteen refused) and the client found stalled:
            # its second replay met its full queue. A server that blocked there never gets here.
            deadline = time.monotonic() + 30
            while server.refused < 14 or server.stalled < 1:
                assert time.monotonic() < deadline, (server.refused, server.stalled)
                time.sleep(0.01)
            good = dealer(pub.replay_endpoint)
            try:
                start = time.monotonic()
                replies = replay(good, 2990)
                answered_in = time.monotonic() - start
            finally:
                good.close()
        finally:
            stalled.close()
    assert answered_in < 1.0
    assert [int.from_bytes(f[2], "big", signed=True) for f in replies] == [*range(2990, 3000), -1]
    assert any(log["event"] == "kv_events.replay_client_stalled" for log in logs)


def test_a_subscriber_gap_is_filled_while_others_stall_the_replay_socket(closing):
    pub = closing(ZmqEventPublisher(config(replay=True)))
    for i in range(3000):
        pub.publish(batch(i, tokens=1000))
    pub.flush()
    sub = closing(KvEventSubscriber(pub.endpoint, pub.replay_endpoint, replay_timeout=1.0))
    got = wait_live(pub, sub)
    poll_until(sub, lambda g: g[-1][0] >= pub.last_seq, got, timeout=10.0)
    stalled = [stalled_client(pub.replay_endpoint, 16) for _ in range(2)]
    try:
        time.sleep(0.2)
        sub._sub.setsockopt(zmq.UNSUBSCRIBE, b"")  # the subscriber misses a second of batches
        time.sleep(0.1)
        first_missed = pub.last_seq + 1
        for i in range(10):
            pub.publish(batch(5000 + i))
            time.sleep(0.1)
        pub.flush()
        sub._sub.setsockopt(zmq.SUBSCRIBE, b"")
        after = wait_live(pub, sub)
        poll_until(sub, lambda g: g[-1][0] >= pub.last_seq, after)
    finally:
        for sock in stalled:
            sock.close()
    assert not any(isinstance(n, HistoryLost) for n in sub.notices), sub.notices
    assert any(isinstance(n, GapFilled) and n.start == first_missed for n in sub.notices)
    assert seqs(after) == list(range(seqs(after)[0], pub.last_seq + 1))  # no hole left
    assert seqs(after)[0] == first_missed


def test_requests_beyond_the_client_cap_get_an_end_marker_in_order(closing):
    pub = closing(
        ZmqEventPublisher(config(replay=True, heartbeat_interval=0, topic="kv"), start=False)
    )
    for i in range(5):
        pub.publish(batch(i))
    pub.flush()
    sock = dealer(pub.replay_endpoint)
    try:
        for start in (3, 0, 4, 1, 2):
            sock.send_multipart([b"", start.to_bytes(8, "big")])
        time.sleep(0.2)  # all five wait at the socket: the replay thread reads them at once
        pub.start()
        answers: list[list[int]] = [[]]
        while len(answers) <= 5:
            assert sock.poll(5000), answers
            frames = sock.recv_multipart()
            seq = int.from_bytes(frames[2], "big", signed=True)
            answers[-1].append(seq)
            if seq == -1:
                # What engines' clients read as the end of a replay, framed as they send it.
                assert frames[1] == frames[3] == b""
                answers.append([])
    finally:
        sock.close()
    cap = pub._replay.max_per_client
    served = [[3, 4, -1], [0, 1, 2, 3, 4, -1], [4, -1], [1, 2, 3, 4, -1], [2, 3, 4, -1]]
    assert 1 <= cap < 5
    assert answers[:5] == served[:cap] + [[-1]] * (5 - cap)
    assert pub._replay.refused == 5 - cap


def test_a_publisher_restarted_on_the_same_endpoints_binds_them_at_once():
    # libzmq frees the replay ROUTER's port in its I/O thread after close() returns; shutdown
    # waits for that, or a restart on the same endpoint failed in up to 3% of tries.
    for _ in range(400):
        first = ZmqEventPublisher(config(replay=True))
        first.shutdown()
        again = KvEventsConfig(
            endpoint=first.endpoint, replay_endpoint=first.replay_endpoint, heartbeat_interval=0
        )
        ZmqEventPublisher(again).shutdown()
