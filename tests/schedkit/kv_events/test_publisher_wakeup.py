"""When the ZeroMQ publisher's sender thread looks at its queue: polling while batches come,
asleep after a quiet spell, and woken by publish, flush and shutdown."""

from __future__ import annotations

import time

from schedkit.kv_events import KvEventSubscriber, ZmqEventPublisher
from schedkit.kv_events.zmq_publisher import IDLE_AFTER, POLL_INTERVAL
from tests.schedkit.kv_events.helpers import batch, config, wait_live


def arrival_seconds(pub: ZmqEventPublisher, sub: KvEventSubscriber, i: int) -> float:
    """Publish batch ``i`` without flushing; seconds until the subscriber has it."""
    start = time.monotonic()
    pub.publish(batch(i))
    while True:
        got = sub.poll(1)
        if any(b.ts == float(i) for _, b in got):
            return time.monotonic() - start
        assert time.monotonic() - start < 5, f"batch {i} never arrived"


def asleep(pub: ZmqEventPublisher, timeout: float = 10.0) -> bool:
    """Wait until the sender thread sleeps (a quiet spell of ``IDLE_AFTER`` seconds, then
    its next look at the queue, later on a loaded machine); whether it does in ``timeout``."""
    deadline = time.monotonic() + timeout
    while not pub._asleep:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_batches_go_out_without_flush_while_polling_and_after_sleeping(closing):
    pub = closing(ZmqEventPublisher(config()))
    sub = closing(KvEventSubscriber(pub.endpoint))
    wait_live(pub, sub)
    while sub.poll(20):
        pass

    polling = sorted(arrival_seconds(pub, sub, i) for i in range(20))
    assert not pub._asleep
    # Within a few poll intervals (generous for a loaded machine), never a stall.
    assert polling[len(polling) // 2] < 50 * POLL_INTERVAL

    assert asleep(pub), "the sender should sleep after a quiet spell"
    assert arrival_seconds(pub, sub, 100) < 0.5
    assert pub.published >= 21 and pub.dropped == 0


def test_flush_and_shutdown_wake_a_sleeping_sender(closing):
    pub = closing(ZmqEventPublisher(config()))  # shut down even if an assertion fails first
    assert asleep(pub)
    pub.publish(batch(0))
    start = time.monotonic()
    assert pub.flush(timeout=2.0)
    flushed = time.monotonic() - start
    assert asleep(pub)
    start = time.monotonic()
    pub.shutdown(timeout=1.0)
    assert flushed + time.monotonic() - start < 1.5 - (IDLE_AFTER + 0.1)
    assert not pub._sender.is_alive() and pub.published == 1


def test_publish_wakes_the_sender_only_when_the_queue_reaches_a_quarter(closing):
    # Without threads nothing takes a wakeup, so the wakeup lock shows every one given:
    # it is held while none is pending.
    pub = closing(ZmqEventPublisher(config(max_queue_size=16), start=False))
    for i in range(3):
        pub.publish(batch(i))
        assert pub._wakeup.locked(), f"publish {i} woke the sender below the mark"
    pub.publish(batch(3))  # the queue now holds 16 // 4 batches
    assert not pub._wakeup.locked()
