"""KvEventSubscriber against a raw engine-like server written here: an XPUB (so the test knows
when the subscription is live) and a replay ROUTER that answers the way SGLang does, without
the topic frame."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from schedkit.kv_events import (
    GapDetected,
    GapFilled,
    HistoryLost,
    KvEventSubscriber,
    PublisherRestarted,
    encode_batch,
)
from tests.schedkit.kv_events.helpers import batch, poll_until, seqs

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class SglangLikeServer:
    """Live frames ``[topic, seq, payload]``; replay replies ``["", seq, payload]`` + end marker."""

    def __init__(self, topic: bytes = b"", answer_replays: bool = True) -> None:
        ctx = zmq.Context.instance()
        self.topic = topic
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.pub.bind_to_random_port('tcp://127.0.0.1')}"
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.replay_endpoint = f"tcp://127.0.0.1:{port}"
        self.stored: dict[int, bytes] = {}
        self.requests: list[int] = []
        self._answer = answer_replays
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replays, daemon=True)
        self._thread.start()

    def wait_subscribed(self) -> None:
        assert self.pub.poll(5000), "no subscription arrived"
        assert self.pub.recv() == b"\x01" + self.topic

    def send(self, seq: int, live: bool = True, payload: bytes | None = None) -> None:
        """Store batch ``seq`` for replay and, if ``live``, publish it."""
        payload = encode_batch(batch(seq)) if payload is None else payload
        self.stored[seq] = payload
        if live:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def _serve_replays(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(20):
                continue
            identity, _, start = self.router.recv_multipart()
            # Like the engines' replay servers, any request is read as a start seq; only
            # replay requests proper (8 bytes) are recorded.
            if len(start) == 8:
                self.requests.append(int.from_bytes(start, "big"))
            if not self._answer:
                continue
            if len(start) != 8:
                self.router.send_multipart([identity, b"", END_SEQ, b""])
                continue
            for seq in sorted(self.stored):
                if seq >= self.requests[-1]:
                    self.router.send_multipart(
                        [identity, b"", seq.to_bytes(8, "big"), self.stored[seq]]
                    )
            self.router.send_multipart([identity, b"", END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.router.close()
        self.pub.close()


@pytest.fixture
def server():
    srv = SglangLikeServer(topic=b"kv")
    yield srv
    srv.close()


def subscribe(srv: SglangLikeServer, replay: bool = True, **kwargs) -> KvEventSubscriber:
    sub = KvEventSubscriber(
        srv.endpoint, srv.replay_endpoint if replay else None, srv.topic.decode(), **kwargs
    )
    srv.wait_subscribed()
    return sub


def test_gap_is_filled_from_replies_without_topic_frame(server, closing):
    sub = closing(subscribe(server))
    for seq in range(3):
        server.send(seq)
    got = poll_until(sub, lambda g: len(g) >= 3, [])
    for seq in (3, 4, 5, 7):
        server.send(seq, live=False)
    server.send(6)  # replay from 3 returns 3..7
    server.send(7)  # already delivered by the replay: dropped
    server.send(8)
    poll_until(sub, lambda g: g[-1][0] >= 8, got)

    assert seqs(got) == list(range(9))
    assert [b.ts for _, b in got] == [float(i) for i in range(9)]
    assert server.requests == [3]
    assert sub.notices == [GapDetected(3, 6), GapFilled(3, 5)]
    assert sub.last_seq == 8


def test_late_joiner_replays_from_zero(server, closing):
    for seq in range(5):
        server.send(seq, live=False)
    sub = closing(subscribe(server))
    server.send(5)
    got = poll_until(sub, lambda g: len(g) >= 6, [])
    assert seqs(got) == list(range(6))
    assert server.requests == [0]
    assert sub.notices == [GapFilled(0, 4)]


def test_replay_starting_above_the_gap_is_history_lost(server, closing):
    sub = closing(subscribe(server))
    server.send(0)
    got = poll_until(sub, lambda g: len(g) >= 1, [])
    for seq in (2, 3):  # seq 1 is gone from the buffer
        server.send(seq, live=False)
    server.send(4)
    poll_until(sub, lambda g: g[-1][0] >= 4, got)
    assert seqs(got) == [0, 2, 3, 4]
    assert sub.notices == [GapDetected(1, 4), HistoryLost(1, 2)]


def test_gap_without_replay_endpoint_is_history_lost(server, closing):
    sub = closing(subscribe(server, replay=False))
    for seq in (0, 1, 4, 5):
        server.send(seq)
    got = poll_until(sub, lambda g: len(g) >= 4, [])
    assert seqs(got) == [0, 1, 4, 5]
    assert sub.notices == [HistoryLost(2, None)]


def test_seq_going_back_is_a_publisher_restart(server, closing):
    sub = closing(subscribe(server, replay=False))
    for seq in (0, 1, 2, 3, 0, 1):
        server.send(seq)
    got = poll_until(sub, lambda g: len(g) >= 6, [])
    assert seqs(got) == [0, 1, 2, 3, 0, 1]
    assert sub.notices == [PublisherRestarted(3, 0)]


def test_unanswered_replay_times_out_as_history_lost(closing):
    srv = SglangLikeServer(answer_replays=False)
    try:
        sub = closing(subscribe(srv, replay_timeout=0.2))
        srv.send(0)
        got = poll_until(sub, lambda g: len(g) >= 1, [])
        srv.send(2)
        start = time.monotonic()
        poll_until(sub, lambda g: len(g) >= 2, got)
        assert 0.2 <= time.monotonic() - start < 3.0
        assert seqs(got) == [0, 2]
        assert sub.notices == [GapDetected(1, 2), HistoryLost(1, None)]
        assert srv.requests == [1]
    finally:
        srv.close()


def test_malformed_frames_and_undecodable_payloads_are_skipped(server, closing):
    sub = closing(subscribe(server, replay=False))
    server.pub.send_multipart([b"kv", b"short", b"x"])
    server.pub.send_multipart([b"kv", (0).to_bytes(8, "big")])
    server.send(0)
    server.send(1, payload=b"\xc1")  # not msgpack: counted, seq still consumed
    server.send(2)
    got = poll_until(sub, lambda g: len(g) >= 2, [])
    assert seqs(got) == [0, 2]
    assert sub.decode_errors == 1
    assert sub.notices == []


def test_iteration_stops_after_idle_timeout(server, closing):
    sub = closing(subscribe(server))
    for seq in range(3):
        server.send(seq)
    start = time.monotonic()
    items = list(sub.iter_batches(idle_timeout=0.3))
    assert seqs(items) == [0, 1, 2]
    assert time.monotonic() - start < 3.0


def test_close_from_another_thread_ends_iteration(server):
    sub = subscribe(server)
    server.send(0)
    timer = threading.Timer(0.3, sub.close)
    timer.start()
    start = time.monotonic()
    items = list(sub)
    timer.join()
    assert seqs(items) == [0]
    assert time.monotonic() - start < 3.0
    sub.close()
    assert sub.poll(10) == []


def test_close_inside_the_loop_and_context_manager(server):
    received = []
    with subscribe(server, on_notice=received.append) as sub:
        for seq in (0, 1, 2):
            server.send(seq, live=seq != 1)
        for seq, _ in sub:
            if seq == 2:
                sub.close()
    assert sub.notices == []
    assert received == [GapDetected(1, 2), GapFilled(1, 1)]
    assert sub.poll(10) == []


def test_bad_endpoint_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot connect to 'tcp://no-port'"):
        KvEventSubscriber("tcp://no-port")
