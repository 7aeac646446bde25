"""KvEventSubscriber against a publisher that dies or restarts, and a subscriber its owner
forgets: poll keeps its timeout, a restart right after a batch is noticed, an epoch check the
old publisher never answered holds nothing up, what went out while the live socket was away is
replayed, finalisation never blocks."""

from __future__ import annotations

import faulthandler
import gc
import statistics
import time
import weakref

import pytest
import zmq

from schedkit.kv_events import (
    AllBlocksCleared,
    KVEventBatch,
    KvEventsConfig,
    KvEventSubscriber,
    PublisherRestarted,
    ZmqEventPublisher,
    encode_batch,
)
from schedkit.kv_events.replay import END_SEQ, EPOCH_REQUEST
from tests.schedkit.kv_events.helpers import (
    batch,
    config,
    poll_until,
    seqs,
    subscriber_for,
    wait_connected,
    wait_live,
    wait_released,
)


def test_poll_keeps_its_timeout_once_the_publisher_is_dead(closing):
    pub = ZmqEventPublisher(config(replay=True))
    sub = closing(subscriber_for(pub, epoch_check_interval=0.05, replay_timeout=5.0))
    got = wait_live(pub, sub)
    poll_until(sub, lambda g: g[-1][0] >= pub.last_seq, got)
    pub.shutdown()

    durations = []
    end = time.monotonic() + 0.5  # 10 epoch checks fall due, none is ever answered
    while time.monotonic() < end:
        start = time.perf_counter()
        assert sub.poll(0) == []
        durations.append(time.perf_counter() - start)
        time.sleep(0.01)
    assert statistics.median(durations) < 0.05
    assert max(durations) < 0.2, max(durations)  # an epoch check used to wait 5 s
    start = time.perf_counter()
    sub.poll(100)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("first_poll", ["before", "after_restart", "after_reconnect"])
def test_a_restart_right_after_publishing_delivers_the_new_stream(closing, first_poll):
    pub = ZmqEventPublisher(config(replay=True))
    # No periodic epoch check comes to the rescue within the test.
    sub = closing(subscriber_for(pub, epoch_check_interval=60.0))
    if first_poll == "before":
        probes = wait_live(pub, sub)
        poll_until(sub, lambda g: g[-1][0] >= pub.last_seq, probes)
    else:
        time.sleep(0.3)  # connected and subscribed, but it has not polled yet
    first = pub.last_seq + 1
    for i in range(5):
        pub.publish(batch(i))
    pub.flush()
    endpoint, replay_endpoint = pub.endpoint, pub.replay_endpoint
    pub.shutdown()  # and a new publisher on the same endpoints as soon as they are free
    wait_released(replay_endpoint)
    new = closing(
        ZmqEventPublisher(
            KvEventsConfig(endpoint=endpoint, replay_endpoint=replay_endpoint, heartbeat_interval=0)
        )
    )
    new.publish(KVEventBatch(0.0, [AllBlocksCleared()]))  # as a cache's reset() announces
    for i in range(1, 5):
        new.publish(batch(100 + i))
    new.flush()
    if first_poll == "after_reconnect":
        wait_connected(endpoint)  # the live socket is connected to the new publisher

    got = wait_live(new, sub, timeout=10.0)
    poll_until(sub, lambda g: any(b.events == [AllBlocksCleared()] for _, b in g), got)
    poll_until(sub, lambda g: g[-1][0] >= new.last_seq, got)
    cleared = [i for i, (_, b) in enumerate(got) if b.events == [AllBlocksCleared()]]
    assert len(cleared) == 1, seqs(got)
    old_tail, new_stream = got[: cleared[0]], got[cleared[0] :]
    assert seqs(new_stream) == list(range(new.last_seq + 1))
    assert [b.ts for _, b in new_stream[1:5]] == [101.0, 102.0, 103.0, 104.0]
    # The old publisher's last batches, unless the subscriber saw the new connection before
    # it read them: it then drops them, as nothing tells them from the new stream.
    assert [b.ts for _, b in old_tail] in ([0.0, 1.0, 2.0, 3.0, 4.0], [])
    assert seqs(old_tail) == list(range(first, first + len(old_tail)))
    if first_poll == "after_reconnect":
        assert old_tail == []
    restarts = [n for n in sub.notices if isinstance(n, PublisherRestarted)]
    if first == 0 and not old_tail:
        assert restarts == []  # nothing had been delivered: nothing to void
    else:
        assert len(restarts) == 1 and restarts[0].last_seq == first + len(old_tail) - 1


def test_an_epoch_check_the_old_publisher_never_answered_does_not_hold_up_the_new_one(closing):
    context = zmq.Context()  # terminated once the old publisher is gone: its ports are free
    live, router = context.socket(zmq.XPUB), context.socket(zmq.ROUTER)
    for sock in (live, router):
        sock.setsockopt(zmq.LINGER, 0)
    endpoint = f"tcp://127.0.0.1:{live.bind_to_random_port('tcp://127.0.0.1')}"
    replay_endpoint = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
    # An answer that never comes is given up on after 30 s, far longer than the test takes.
    sub = closing(
        KvEventSubscriber(endpoint, replay_endpoint, epoch_check_interval=0.05, replay_timeout=30)
    )
    try:
        # The old publisher tells its epoch and sends seq 0...
        assert router.poll(5000) and live.poll(5000)
        identity, _, request = router.recv_multipart()
        assert request == EPOCH_REQUEST
        router.send_multipart([identity, b"", b"", END_SEQ, b"old-epoc"])
        live.recv()  # the subscription
        live.send_multipart([b"", (0).to_bytes(8, "big"), encode_batch(batch(0))])
        assert seqs(poll_until(sub, lambda g: g, [])) == [0]
        # ...then hangs: it reads the next epoch check but never answers it, and dies.
        while not router.poll(20):
            sub.poll(20)
        identity, _, request = router.recv_multipart()
        assert request == EPOCH_REQUEST
    finally:
        live.close()
        router.close()
        context.term()
    new = closing(
        ZmqEventPublisher(
            KvEventsConfig(endpoint=endpoint, replay_endpoint=replay_endpoint, heartbeat_interval=0)
        )
    )
    new.publish(KVEventBatch(0.0, [AllBlocksCleared()]))
    for i in range(1, 5):
        new.publish(batch(100 + i))
    new.flush()

    # The new publisher's answers are not taken for the lost check's: the restart is seen,
    # and the new stream delivered, without waiting for the lost answer.
    got = wait_live(new, sub, timeout=10.0)
    poll_until(sub, lambda g: g[-1][0] >= new.last_seq, got, timeout=10.0)
    assert seqs(got) == list(range(new.last_seq + 1))
    assert got[0][1].events == [AllBlocksCleared()]
    assert [(type(n), n.last_seq, n.reason) for n in sub.notices] == [
        (PublisherRestarted, 0, "epoch")
    ]


def test_batches_sent_while_the_live_socket_was_away_are_replayed_once_it_is_back(closing):
    # One publisher throughout (one epoch, its replay socket up), whose live socket goes away
    # for a while; nothing is sent after it is back, so no later seq shows what was missed.
    context = zmq.Context()
    router, live = context.socket(zmq.ROUTER), context.socket(zmq.XPUB)
    for sock in (live, router):
        sock.setsockopt(zmq.LINGER, 0)
    port = live.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    replay_endpoint = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
    sent: dict[int, bytes] = {}

    def publish(seq: int, live_too: bool = True) -> None:
        sent[seq] = encode_batch(batch(seq))
        if live_too:
            live.send_multipart([b"", seq.to_bytes(8, "big"), sent[seq]])

    def serve_replays() -> None:
        while router.poll(0):
            identity, _, request = router.recv_multipart()
            if request != EPOCH_REQUEST:
                for seq in range(int.from_bytes(request, "big"), len(sent)):
                    router.send_multipart([identity, b"", b"", seq.to_bytes(8, "big"), sent[seq]])
            epoch = b"epoch-01" if request == EPOCH_REQUEST else b""
            router.send_multipart([identity, b"", b"", END_SEQ, epoch])

    def poll_serving(done) -> list:
        got: list = []
        deadline = time.monotonic() + 10.0
        while not done(got):
            assert time.monotonic() < deadline, f"got {seqs(got)}"
            serve_replays()
            got += sub.poll(20)
        return got

    sub = closing(
        KvEventSubscriber(endpoint, replay_endpoint, replay_timeout=30, epoch_check_interval=60)
    )
    try:
        assert live.poll(5000)
        live.recv()  # the subscription
        publish(0)
        assert seqs(poll_serving(lambda g: g)) == [0]
        live.close()
        publish(1, live_too=False)  # no one connected: they go out to nobody
        publish(2, live_too=False)
        live = context.socket(zmq.XPUB)
        live.setsockopt(zmq.LINGER, 0)
        deadline = time.monotonic() + 5.0
        while True:  # the closed socket may hold the port for a moment
            try:
                live.bind(endpoint)
                break
            except zmq.ZMQError:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        assert seqs(poll_serving(lambda g: g and g[-1][0] == 2)) == [1, 2]
        assert sub.notices == []
    finally:
        live.close()
        router.close()
        context.term()


class Owner:
    """Holds a subscriber whose notice handler is one of its own methods: a reference cycle.
    With ``own_context`` it also owns the subscriber's context, as KvRouter does, so the
    context is in the cycle too (its finaliser terminates it)."""

    def __init__(self, pub, own_context: bool) -> None:
        self.context = zmq.Context() if own_context else None
        self.sub = subscriber_for(pub, context=self.context, on_notice=self.on_notice)

    def on_notice(self, notice) -> None:
        pass


@pytest.mark.parametrize("own_context", [False, True])
def test_a_subscriber_dropped_in_a_cycle_is_collected_without_blocking(closing, own_context):
    # The timed collection walks only what the test creates, not the whole suite's heap
    # (a full collection of that takes about a second on a loaded machine by itself).
    gc.collect()
    gc.freeze()
    try:
        pub = closing(ZmqEventPublisher(config(replay=True)))
        owner = Owner(pub, own_context)
        wait_live(pub, owner.sub)
        collected = weakref.ref(owner.sub)
        del owner
        faulthandler.dump_traceback_later(20, exit=True)  # a hang must not hang the whole run
        try:
            with pytest.warns(ResourceWarning) as warned:
                start = time.monotonic()
                gc.collect()
                elapsed = time.monotonic() - start
        finally:
            faulthandler.cancel_dump_traceback_later()
    finally:
        gc.unfreeze()
    assert elapsed < 1.0
    assert collected() is None
    messages = [str(w.message) for w in warned]
    assert any("KvEventSubscriber" in m and "without close()" in m for m in messages), messages
