"""A restarted publisher's old tail, still queued on the subscriber's live socket when the new
publisher's epoch is seen, is never taken for the new stream: not when it is longer than
one ``poll`` reads, nor when part of it is still on its way from the old connection."""

from __future__ import annotations

import time

import pytest
import zmq

from schedkit.kv_events import (
    AllBlocksCleared,
    KVEventBatch,
    KvEventSubscriber,
    PublisherRestarted,
    encode_batch,
    subscriber_sockets,
)
from schedkit.kv_events.replay import END_SEQ, EPOCH_REQUEST
from tests.schedkit.kv_events.helpers import batch, seqs, wait_connected

DEADLINE = 10.0  # generous: every wait below ends as soon as the machine lets it


class Publisher:
    """A publisher by hand: an XPUB (which tells when a subscription arrives) and a ROUTER
    answering epoch questions with ``epoch`` and replays from ``sent``."""

    def __init__(self, epoch: bytes, endpoint: str | None = None, replay: str | None = None):
        self.epoch = epoch
        self.context = zmq.Context()
        self.live, self.router = self.context.socket(zmq.XPUB), self.context.socket(zmq.ROUTER)
        for sock in (self.live, self.router):
            sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = bind(self.live, endpoint)
        self.replay_endpoint = bind(self.router, replay)
        self.sent: list[bytes] = []

    def publish(self, payload: bytes) -> None:
        self.sent.append(payload)
        self.live.send_multipart([b"", (len(self.sent) - 1).to_bytes(8, "big"), payload])

    def serve(self) -> None:
        """Answer what the replay socket was asked."""
        while self.router.poll(0):
            identity, _, request = self.router.recv_multipart()
            if request != EPOCH_REQUEST:
                for seq in range(int.from_bytes(request, "big"), len(self.sent)):
                    frames = [identity, b"", b"", seq.to_bytes(8, "big"), self.sent[seq]]
                    self.router.send_multipart(frames)
            epoch = self.epoch if request == EPOCH_REQUEST else b""
            self.router.send_multipart([identity, b"", b"", END_SEQ, epoch])

    def close(self) -> None:
        self.live.close()
        self.router.close()
        self.context.term()


def bind(sock: zmq.Socket, endpoint: str | None) -> str:
    """Bind to a free loopback port, or where a socket just closed (which may hold the port
    for a moment); the endpoint."""
    if endpoint is None:
        return f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            sock.bind(endpoint)
            return endpoint
        except zmq.ZMQError:
            assert time.monotonic() < deadline, f"{endpoint} still held"
            time.sleep(0.01)


def new_stream_after_old_tail(closing, *, hwm: int, tail: int, seen: str) -> list:
    """Seq 0 from an old publisher, then ``tail`` more left unread when it dies; a new one on
    the same endpoints whose epoch the subscriber sees ``seen`` ("on_reconnect": once the
    live socket is back; "by_check": by its periodic check). What it delivered after seq 0."""
    old = Publisher(b"old-epoc")
    sub = closing(
        KvEventSubscriber(
            old.endpoint,
            old.replay_endpoint,
            hwm=hwm,
            replay_timeout=30,
            epoch_check_interval=60 if seen == "on_reconnect" else 0.05,
        )
    )
    try:
        assert old.live.poll(DEADLINE * 1000)
        old.live.recv()  # the subscription
        old.publish(encode_batch(batch(0)))
        got: list = []
        deadline = time.monotonic() + DEADLINE
        while not got:
            assert time.monotonic() < deadline, "seq 0 never came"
            old.serve()
            got += sub.poll(20)
        assert seqs(got) == [0]
        for seq in range(1, tail + 1):  # the tail, left unread
            old.publish(encode_batch(batch(seq)))
    finally:
        old.close()
    new = Publisher(b"new-epoc", old.endpoint, old.replay_endpoint)
    try:
        if seen == "on_reconnect":
            # The live socket connects again only once it has read the old connection to its
            # end: then the whole tail is queued. (Its subscription goes out when the socket
            # processes its commands, which reading its EVENTS does, without reading a frame.)
            deadline = time.monotonic() + DEADLINE
            while not new.live.poll(20):
                assert time.monotonic() < deadline, "the live socket never connected again"
                sub._sub.getsockopt(zmq.EVENTS)
        for events in ([AllBlocksCleared()], [], []):
            new.publish(encode_batch(KVEventBatch(100.0 + len(new.sent), events)))
        got = []
        if seen == "by_check":
            # The check goes out with the first poll, which reads at most two frames of the
            # tail; the rest is still queued, or on its way, when the answer is read.
            wait_connected(new.replay_endpoint)
            got += sub.poll(0)
            assert new.router.poll(DEADLINE * 1000), "the epoch check never came"
        deadline = time.monotonic() + DEADLINE
        while not any(isinstance(n, PublisherRestarted) for n in sub.notices) or (
            not got or got[-1][1].ts < 100.0 + len(new.sent) - 1
        ):
            assert time.monotonic() < deadline, (seqs(got), sub.notices)
            new.serve()
            got += sub.poll(20)
        new.publish(encode_batch(KVEventBatch(100.0 + len(new.sent), [])))  # tail gone
        while got[-1][0] < len(new.sent) - 1 or got[-1][1].ts < 100:
            assert time.monotonic() < deadline, (seqs(got), sub.notices)
            new.serve()
            got += sub.poll(20)
    finally:
        new.close()
    restarts = [(type(n), n.reason) for n in sub.notices if isinstance(n, PublisherRestarted)]
    assert restarts == [(PublisherRestarted, "epoch")]
    return got


def test_an_old_tail_longer_than_one_poll_reads_is_all_dropped(closing, monkeypatch):
    monkeypatch.setattr(subscriber_sockets, "_MAX_READ", 2)  # two frames a poll
    got = new_stream_after_old_tail(closing, hwm=64, tail=10, seen="on_reconnect")
    assert [(seq, b.ts) for seq, b in got] == [(0, 100.0), (1, 101.0), (2, 102.0), (3, 103.0)]


@pytest.mark.parametrize("hwm", [2, 8])
def test_an_old_tail_still_arriving_when_the_epoch_is_checked_is_all_dropped(
    closing, monkeypatch, hwm
):
    # The live queue holds hwm frames: the rest of the tail waits on the old connection, and
    # comes in as the queue is read. Old frames read before the check came back are the old
    # publisher's to deliver; none after it.
    monkeypatch.setattr(subscriber_sockets, "_MAX_READ", 2)
    got = new_stream_after_old_tail(closing, hwm=hwm, tail=40, seen="by_check")
    new = next(i for i, (_, b) in enumerate(got) if b.ts >= 100)
    assert [(seq, b.ts) for seq, b in got[:new]] == [(seq, float(seq)) for seq in range(1, new + 1)]
    assert [(seq, b.ts) for seq, b in got[new:]] == [(0, 100.0), (1, 101.0), (2, 102.0), (3, 103.0)]
