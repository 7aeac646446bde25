"""What the engines' publishers get wrong and ours must not: concurrent publish, replay floods,
restarts that run past the old seqs, a missed tail while idle."""

from __future__ import annotations

import threading
import time
import tracemalloc

import msgspec
import pytest
import zmq

from schedkit.kv_events import (
    AllBlocksCleared,
    GapFilled,
    KVEventBatch,
    KvEventsConfig,
    KvEventSubscriber,
    PublisherRestarted,
    ZmqEventPublisher,
)
from schedkit.kv_events.replay import END_SEQ, EPOCH_REQUEST
from tests.schedkit.kv_events.helpers import (
    batch,
    config,
    poll_until,
    seqs,
    subscriber_for,
    wait_live,
    wait_released,
)


def raw_sub(endpoint: str) -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def test_publish_from_several_threads_sends_in_seq_order(closing):
    pub = closing(ZmqEventPublisher(config(heartbeat_interval=0)))
    sub = raw_sub(pub.endpoint)
    try:
        while True:  # until the subscription is live
            pub.publish(KVEventBatch(-1.0, []))
            pub.flush()
            if sub.poll(20):
                break
        while sub.poll(50):
            sub.recv_multipart()
        first = pub.published
        threads, per_thread = 4, 500

        def publish(t: int) -> None:
            for i in range(per_thread):
                pub.publish(KVEventBatch(float(t * per_thread + i), []))

        workers = [threading.Thread(target=publish, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert pub.flush()
        wire = []
        while len(wire) < threads * per_thread and sub.poll(2000):
            _, seq, payload = sub.recv_multipart()
            wire.append((int.from_bytes(seq, "big"), msgspec.msgpack.decode(payload)[0]))
    finally:
        sub.close()
    assert [s for s, _ in wire] == list(range(first, first + threads * per_thread))
    for t in range(threads):  # each thread's batches keep its order
        mine = [ts for _, ts in wire if t * per_thread <= ts < (t + 1) * per_thread]
        assert mine == sorted(mine) and len(mine) == per_thread


def test_a_flood_of_replay_requests_keeps_memory_bounded_and_live_flowing(closing):
    pub = closing(ZmqEventPublisher(config(replay=True, buffer_steps=2000, heartbeat_interval=0)))
    for i in range(2000):
        pub.publish(batch(i, tokens=64))
    assert pub.flush()
    sub = closing(subscriber_for(pub))
    caught_up(pub, sub)
    flood = zmq.Context.instance().socket(zmq.DEALER)
    flood.setsockopt(zmq.LINGER, 0)
    flood.setsockopt(zmq.SNDHWM, 0)
    flood.connect(pub.replay_endpoint)
    replay = pub._replay
    tracemalloc.start()
    try:
        for _ in range(10_000):  # each asks for the whole ring, and nobody reads the answers
            flood.send_multipart([b"", (0).to_bytes(8, "big")])
        latencies = []
        for i in range(20):
            start = time.monotonic()
            pub.publish(batch(10_000 + i))
            want = 10_000.0 + i
            poll_until(sub, lambda g, want=want: g and g[-1][1].ts == want, [], timeout=5.0)
            latencies.append(time.monotonic() - start)
        # Every request read, taken or refused. (Not "all but max_requests refused": a replay
        # that ends, or a client dropped for its full queue, frees its place for the next
        # request, so the more slowly the flood comes in, the more are taken.)
        deadline = time.monotonic() + 10
        while replay.requests < 10_000:
            assert time.monotonic() < deadline, f"only {replay.requests} requests were read"
            time.sleep(0.01)
        peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
        flood.close()
    assert max(latencies) < 1.0, latencies
    # Copying the 2000-batch ring for each request would take over 100 MB; streaming from
    # it, a held request costs its client identity and a position.
    assert peak_mb < 20, peak_mb


def test_the_replay_thread_survives_garbage(closing):
    pub = closing(ZmqEventPublisher(config(replay=True, heartbeat_interval=0)))
    pub.publish(batch(0))
    pub.flush()
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(pub.replay_endpoint)
    try:
        for frames in ([b"x"], [b"", b""], [b"", b"\xff" * 9], [b"a", b"b", b"c"] * 10, [b""]):
            dealer.send_multipart(frames)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replies = [dealer.recv_multipart(), dealer.recv_multipart()]
        dealer.send_multipart([b"", EPOCH_REQUEST])
        epoch_reply = dealer.recv_multipart()
    finally:
        dealer.close()
    assert int.from_bytes(replies[0][2], "big") == 0 and replies[1][2] == END_SEQ
    assert epoch_reply[2] == END_SEQ and epoch_reply[3] == pub.epoch and len(pub.epoch) == 8


def caught_up(pub, sub) -> int:
    """Wait until the subscriber has every batch ``pub`` sent; its last seq."""
    got = wait_live(pub, sub)
    poll_until(sub, lambda g: g[-1][0] >= pub.last_seq, got)
    return sub.last_seq


def deaf(sub: KvEventSubscriber, deaf: bool) -> None:
    """Make the subscriber miss (or hear again) live batches; its socket stays connected."""
    sub._sub.setsockopt(zmq.UNSUBSCRIBE if deaf else zmq.SUBSCRIBE, b"")
    time.sleep(0.1)  # the (un)subscription reaches the publisher


@pytest.mark.parametrize("unseen", ["past", "exact"])
def test_a_restart_whose_seqs_run_past_the_old_ones_is_noticed(closing, unseen):
    # past: the new publisher's next seq lands far past the old last one (a gap);
    # exact: it continues the old seqs exactly, so only the epoch tells.
    pub = ZmqEventPublisher(config(replay=True, heartbeat_interval=0))
    sub = closing(subscriber_for(pub, epoch_check_interval=0.05))
    old_last = caught_up(pub, sub)
    deaf(sub, True)
    endpoint, replay_endpoint = pub.endpoint, pub.replay_endpoint
    pub.shutdown()
    wait_released(replay_endpoint)
    new = closing(
        ZmqEventPublisher(
            KvEventsConfig(endpoint=endpoint, replay_endpoint=replay_endpoint, heartbeat_interval=0)
        )
    )
    new.publish(KVEventBatch(0.0, [AllBlocksCleared()]))  # as a cache's reset() announces
    count = old_last + 40 if unseen == "past" else old_last + 1
    for i in range(1, count):
        new.publish(batch(100 + i))
    new.flush()
    deaf(sub, False)
    after = wait_live(new, sub, timeout=10.0)
    poll_until(sub, lambda g: any(isinstance(n, PublisherRestarted) for n in sub.notices), after)
    poll_until(sub, lambda g: g[-1][0] >= new.last_seq, after)
    restarted = [n for n in sub.notices if isinstance(n, PublisherRestarted)]
    assert len(restarted) == 1 and restarted[0].last_seq == old_last
    assert restarted[0].reason == "epoch"  # the seq never went back: the epoch told
    zero = [b for s, b in after if s == 0]
    assert zero and zero[0].events == [AllBlocksCleared()]
    assert seqs(after)[seqs(after).index(0) :] == list(range(new.published))


def test_a_heartbeat_shows_a_missed_tail_while_the_publisher_is_idle(closing):
    pub = closing(ZmqEventPublisher(config(replay=True, heartbeat_interval=0.1)))
    sub = closing(subscriber_for(pub))
    seen = caught_up(pub, sub)
    deaf(sub, True)
    for i in range(5):
        pub.publish(batch(i))
    pub.flush()
    deaf(sub, False)
    # Nothing more is published: only a heartbeat can tell the subscriber what it missed.
    got = poll_until(sub, lambda g: len([b for _, b in g if b.events]) >= 5, [], timeout=5.0)
    assert seqs(got) == list(range(seen + 1, seen + 1 + len(got)))
    assert [b.ts for _, b in got if b.events] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert any(isinstance(n, GapFilled) for n in sub.notices)  # replayed, not heard live
    assert pub.heartbeats >= 1
