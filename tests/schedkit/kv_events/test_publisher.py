"""ZmqEventPublisher over real loopback ZeroMQ, its config and registry."""

from __future__ import annotations

import json
import threading
import time

import msgspec
import pytest
import zmq
from structlog.testing import capture_logs

from schedkit.kv_events import (
    GapDetected,
    GapFilled,
    HistoryLost,
    KVEventBatch,
    KvEventsConfig,
    NullEventPublisher,
    PublisherRestarted,
    ZmqEventPublisher,
    create_publisher,
    decode_batch,
    offset_endpoint,
    parse_kv_events_config,
    register_publisher,
)
from schedkit.kv_events.replay import EPOCH_REQUEST
from schedkit.kv_events.zmq_publisher import END_SEQ
from tests.schedkit.kv_events.helpers import (
    PROBE_TS,
    batch,
    config,
    poll_until,
    seqs,
    subscriber_for,
    wait_live,
    wait_released,
)


def test_late_joiner_recovers_every_batch_through_replay(closing):
    pub = closing(ZmqEventPublisher(config(replay=True, topic="kv")))
    for i in range(30):
        assert pub.publish(batch(i))
    assert pub.flush()
    sub = closing(subscriber_for(pub))

    got = wait_live(pub, sub)
    last = pub.last_seq
    poll_until(sub, lambda g: g[-1][0] >= last, got)

    assert seqs(got) == list(range(last + 1))
    assert [b.ts for _, b in got[:30]] == [float(i) for i in range(30)]
    assert all(b.ts == PROBE_TS for _, b in got[30:])
    assert got[0][1].events[0].block_hashes == [0]
    assert got[0][1].attn_dp_rank == 0  # filled in by the publisher
    assert len(sub.notices) == 1
    assert isinstance(sub.notices[0], GapFilled) and sub.notices[0].start == 0


def test_messages_lost_in_transit_are_recovered_through_replay(closing):
    # High-water marks of 1 make the PUB socket drop while the subscriber is not reading.
    pub = closing(ZmqEventPublisher(config(replay=True, hwm=1)))
    sub = closing(subscriber_for(pub, hwm=1))
    got = wait_live(pub, sub)
    for i in range(1000):
        assert pub.publish(batch(i, tokens=500))
    assert pub.flush()
    last = pub.last_seq
    poll_until(sub, lambda g: g[-1][0] >= last, got)

    assert any(isinstance(n, GapDetected) for n in sub.notices), "no loss happened"
    assert not any(isinstance(n, HistoryLost) for n in sub.notices)
    assert seqs(got) == list(range(got[0][0], last + 1))
    assert [b.ts for _, b in got if b.ts != PROBE_TS] == [float(i) for i in range(1000)]


def test_full_queue_drops_immediately_and_a_late_joiner_sees_the_lost_seqs(closing):
    pub = closing(ZmqEventPublisher(config(replay=True, max_queue_size=3), start=False))
    assert all(pub.publish(batch(i)) for i in range(3))
    assert pub.queue_depth == 3
    start = time.perf_counter()
    assert pub.publish(batch(3)) is False
    assert pub.publish(batch(4)) is False
    assert time.perf_counter() - start < 0.05
    assert (pub.dropped, pub.queue_depth, pub.published) == (2, 3, 0)

    pub.start()
    sub = closing(subscriber_for(pub))
    got = wait_live(pub, sub)  # the first batch it sees is above 0: it replays from 0
    last = pub.published + pub.dropped - 1
    poll_until(sub, lambda g: g[-1][0] >= last, got)

    assert seqs(got)[:4] == [0, 1, 2, 5]  # seqs 3 and 4 were used by the dropped batches
    assert HistoryLost(3, 5) in sub.notices
    assert seqs(got) == [0, 1, 2, *range(5, last + 1)]


def test_history_lost_when_the_buffer_is_smaller_than_the_gap(closing):
    pub = closing(ZmqEventPublisher(config(replay=True, buffer_steps=5)))
    for i in range(20):
        pub.publish(batch(i))
    pub.flush()
    sub = closing(subscriber_for(pub))
    got = wait_live(pub, sub)
    last = pub.last_seq
    poll_until(sub, lambda g: g[-1][0] >= last, got)

    lost = [n for n in sub.notices if isinstance(n, HistoryLost)]
    assert len(lost) == 1
    assert lost[0].expected == 0 and lost[0].replay_start >= 15
    assert seqs(got) == list(range(lost[0].replay_start, last + 1))


def test_publisher_restart_is_reported_and_the_new_stream_replayed(closing):
    pub = ZmqEventPublisher(config(replay=True))
    sub = closing(subscriber_for(pub))
    got = wait_live(pub, sub)
    # Far more than the probes the new publisher sends until the subscriber hears it (one
    # every 20 ms: 11 once its live socket took over 200 ms to reconnect on a loaded machine).
    for i in range(500):
        pub.publish(batch(i))
    pub.flush()
    before = pub.last_seq
    poll_until(sub, lambda g: g[-1][0] >= before, got)
    endpoint, replay_endpoint = pub.endpoint, pub.replay_endpoint
    pub.shutdown()
    wait_released(replay_endpoint)

    restarted = closing(
        ZmqEventPublisher(KvEventsConfig(endpoint=endpoint, replay_endpoint=replay_endpoint))
    )
    after = wait_live(restarted, sub, timeout=10.0)
    last = restarted.last_seq
    poll_until(sub, lambda g: g[-1][0] >= last, after)

    restart = [n for n in sub.notices if isinstance(n, PublisherRestarted)]
    assert len(restart) == 1 and restart[0].last_seq == before
    assert restart[0].new_seq < before and restart[0].new_seq <= last
    assert seqs(after) == list(range(last + 1))  # caught up from 0 on the new publisher


def test_batches_accepted_before_shutdown_all_arrive(closing):
    pub = ZmqEventPublisher(config())
    sub = closing(subscriber_for(pub))
    probes = wait_live(pub, sub)
    first = pub.published
    assert all(pub.publish(batch(i)) for i in range(10_000))
    pub.shutdown()

    got = poll_until(sub, lambda g: len(g) >= 10_000, [])
    got = [item for item in got if item[1].ts != PROBE_TS]
    assert seqs(got) == list(range(first, first + 10_000))
    assert [b.ts for _, b in got] == [float(i) for i in range(10_000)]
    assert (pub.published, pub.dropped, pub.encode_errors) == (first + 10_000, 0, 0)
    assert probes


def test_shutdown_lingers_for_frames_queued_behind_a_slow_subscriber():
    # A tiny receive buffer and queue on the subscriber hold most frames back in the
    # publisher's socket queue; shutdown must still deliver them as the subscriber reads.
    pub = ZmqEventPublisher(config())
    ctx = zmq.Context()
    ctx.setsockopt(zmq.RCVBUF, 8192)
    sub = subscriber_for(pub, hwm=10, context=ctx)
    try:
        wait_live(pub, sub)
        first = pub.published
        for i in range(2000):
            pub.publish(batch(i, tokens=800))
        stopper = threading.Thread(target=pub.shutdown)
        stopper.start()
        got = poll_until(sub, lambda g: len(g) >= 2000, [])
        stopper.join()
    finally:
        pub.shutdown()
        sub.close()
        ctx.term()
    assert seqs(got) == list(range(first, first + 2000))


def test_shutdown_with_a_full_queue_delivers_it_and_is_idempotent(closing):
    pub = ZmqEventPublisher(config(max_queue_size=100), start=False)
    sub = closing(subscriber_for(pub))
    wait_live(pub, sub)  # flush() sends on this thread while no thread runs
    first = pub.published
    assert all(pub.publish(batch(i)) for i in range(100))
    assert pub.publish(batch(100)) is False

    pub.shutdown(timeout=2.0)
    pub.shutdown(timeout=2.0)
    got = poll_until(sub, lambda g: len(g) >= 100, [])

    assert seqs(got) == list(range(first, first + 100))
    assert (pub.published, pub.dropped, pub.queue_depth) == (first + 100, 1, 0)
    assert pub.publish(batch(0)) is False
    assert pub.dropped == 2


def test_shutdown_of_a_running_publisher_is_idempotent():
    pub = ZmqEventPublisher(config(replay=True))
    pub.publish(batch(0))
    pub.shutdown()
    pub.shutdown()
    assert pub.published == 1
    assert pub.publish(batch(1)) is False and pub.dropped == 1
    assert pub.flush(timeout=0.1)


def replay_replies(pub, start: int, *before: list[bytes]) -> list[list[bytes]]:
    """Ask ``pub``'s replay socket from seq ``start`` (after sending ``before``, if any) and
    return every reply frame list up to and including the end marker."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(pub.replay_endpoint)
    try:
        for frames in before:
            dealer.send_multipart(frames)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        replies = []
        while not replies or replies[-1][2] != END_SEQ:
            replies.append(dealer.recv_multipart())
        return replies
    finally:
        dealer.close()


def test_replay_replies_carry_the_topic_and_end_with_the_engines_marker(closing):
    pub = closing(ZmqEventPublisher(config(replay=True, topic="kv")))
    for i in range(5):
        pub.publish(batch(i))
    pub.flush()
    replies = replay_replies(pub, 2, [b"", b"bad"])  # the malformed request is logged, ignored

    assert [f[:2] for f in replies[:-1]] == [[b"", b"kv"]] * 3
    assert [int.from_bytes(f[2], "big") for f in replies[:-1]] == [2, 3, 4]
    assert [decode_batch(f[3]).ts for f in replies[:-1]] == [2.0, 3.0, 4.0]
    # As SGLang and vLLM send it: the end marker's topic frame is empty.
    assert replies[-1] == [b"", b"", (-1).to_bytes(8, "big", signed=True), b""]
    # So is the epoch answer's, an end marker carrying the epoch.
    epoch = replay_replies(pub, 0, [b"", EPOCH_REQUEST])[0]
    assert epoch == [b"", b"", (-1).to_bytes(8, "big", signed=True), pub.epoch]


def test_a_replay_client_that_does_not_read_stalls_neither_live_nor_other_replays(closing):
    pub = closing(ZmqEventPublisher(config(replay=True, buffer_steps=3200)))
    for i in range(3000):  # ~9 MB: one replay fills the stuck client's queue
        pub.publish(batch(i, tokens=1000))
    pub.flush()
    stuck = zmq.Context.instance().socket(zmq.DEALER)
    stuck.setsockopt(zmq.LINGER, 0)
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.setsockopt(zmq.RCVBUF, 4096)
    stuck.connect(pub.replay_endpoint)
    with capture_logs() as logs:
        try:
            for _ in range(2):  # and never reads: the second replay finds its queue full
                stuck.send_multipart([b"", (0).to_bytes(8, "big")])
            sub = closing(subscriber_for(pub))
            got = wait_live(pub, sub)
            for i in range(100):
                pub.publish(batch(i))
            last = pub.last_seq
            poll_until(sub, lambda g: g[-1][0] >= last, got)
        finally:
            stuck.close()
    # Its replays were dropped once its queue was full, not served on and off for seconds.
    assert any(log["event"] == "kv_events.replay_client_stalled" for log in logs)
    assert seqs(got) == list(range(last + 1))  # its own replay from 0 went through
    assert [b.ts for _, b in got[:3000]] == [float(i) for i in range(3000)]


def test_encode_failure_is_counted_and_burns_its_seq(closing):
    pub = closing(ZmqEventPublisher(config(replay=True)))
    pub.publish(batch(0))
    pub.publish(KVEventBatch(ts=1.0, events=[object()]))
    pub.publish(batch(2))
    pub.flush()
    assert (pub.published, pub.encode_errors) == (2, 1)
    replayed = [int.from_bytes(f[2], "big", signed=True) for f in replay_replies(pub, 0)]
    assert replayed == [0, 2, -1]


def test_vllm_profile_end_to_end(closing):
    pub = closing(ZmqEventPublisher(config(replay=True, profile="vllm", topic="vllm")))
    for i in range(5):
        pub.publish(batch(i, tokens=4, rank=1))
    pub.flush()
    sub = closing(subscriber_for(pub))
    got = wait_live(pub, sub)
    poll_until(sub, lambda g: g[-1][0] >= pub.last_seq, got)

    assert seqs(got) == list(range(pub.published))
    assert [b for _, b in got[:5]] == [batch(i, tokens=4, rank=1) for i in range(5)]

    raw = msgspec.msgpack.decode(replay_replies(pub, 0)[0][3])
    assert raw[1][0]["type"] == "BlockStored" and raw[2] == 1


def test_offset_endpoint():
    assert offset_endpoint("tcp://127.0.0.1:5557", 0) == "tcp://127.0.0.1:5557"
    assert offset_endpoint("tcp://127.0.0.1:5557", 3) == "tcp://127.0.0.1:5560"
    assert offset_endpoint("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    assert offset_endpoint("tcp://127.0.0.1:0", 3) == "tcp://127.0.0.1:0"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
    assert offset_endpoint("inproc://kv", 0) == "inproc://kv_dp0"
    with pytest.raises(ValueError, match="no port"):
        offset_endpoint("tcp://127.0.0.1", 1)
    with pytest.raises(ValueError, match="unsupported"):
        offset_endpoint("udp://127.0.0.1:1", 1)


def test_create_publisher_by_name(closing):
    assert isinstance(create_publisher(None), NullEventPublisher)
    zmq_pub = closing(create_publisher(json.dumps({"endpoint": "tcp://127.0.0.1:0"})))
    assert isinstance(zmq_pub, ZmqEventPublisher)

    made = []

    def factory(cfg: KvEventsConfig, dp_rank: int) -> NullEventPublisher:
        made.append((cfg.topic, dp_rank))
        return NullEventPublisher(cfg, dp_rank)

    register_publisher("test-recording", factory)
    register_publisher("test-recording", factory)  # the same factory again is fine
    pub = create_publisher({"publisher": "test-recording", "topic": "t"}, dp_rank=4)
    assert made == [("t", 4)] and pub.dp_rank == 4
    with pytest.raises(ValueError, match="already registered"):
        register_publisher("test-recording", NullEventPublisher)
    with pytest.raises(ValueError, match=r"unknown KV-event publisher 'nope'; valid: null, zmq"):
        create_publisher({"publisher": "nope"})


def test_parse_config_forms():
    assert parse_kv_events_config(None) is None
    assert parse_kv_events_config("") is None
    cfg = parse_kv_events_config('{"publisher": "zmq", "topic": "kv", "buffer_steps": 5}')
    assert (cfg.topic, cfg.buffer_steps, cfg.hwm, cfg.profile, cfg.mode) == (
        "kv",
        5,
        100000,
        "sglang",
        "bind",
    )
    assert cfg.endpoint == "tcp://127.0.0.1:5557" and cfg.replay_endpoint is None
    assert parse_kv_events_config({"profile": "vllm"}).profile == "vllm"
    assert parse_kv_events_config(cfg) is cfg


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"endpont": "x"}, r"unknown KV-events config key\(s\) 'endpont'; valid keys: publisher"),
        ({"hwm": "10"}, r"Expected `int`, got `str` - at `\$.hwm`"),
        ({"max_queue_size": 0}, r"max_queue_size"),
        ({"profile": "trt"}, r"valid values for 'profile': sglang, sglang-array, vllm"),
        ({"mode": "auto"}, r"valid values for 'mode': bind, connect"),
        ("{not json", r"not valid JSON"),
        ("[1, 2]", r"must be a JSON object"),
    ],
)
def test_parse_config_errors(value, message):
    with pytest.raises(ValueError, match=message):
        parse_kv_events_config(value)
