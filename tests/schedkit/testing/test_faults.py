"""FaultyPublisher's faults, each met by a real KvEventSubscriber over loopback sockets."""

from __future__ import annotations

import time

import pytest
import zmq

from schedkit.kv_events import (
    AllBlocksCleared,
    GapFilled,
    HistoryLost,
    KVEventBatch,
    KvEventsConfig,
    KvEventSubscriber,
    PublisherRestarted,
    ZmqEventPublisher,
    encode_batch,
)
from schedkit.kv_events.replay import replay_send_hwm
from tests.schedkit.kv_events.test_replay import (
    survives_a_client_taking_the_next_automatic_routing_id,
)


def batch(i: int) -> KVEventBatch:
    return KVEventBatch(float(i), [])


def live(pub, **kwargs) -> KvEventSubscriber:
    """A subscriber that has received seq 0 live."""
    sub = KvEventSubscriber(pub.endpoint, pub.replay_endpoint, **kwargs)
    pub.wait_subscribed()
    pub.publish(batch(0))
    assert [s for s, _ in collect(sub, lambda g: g)] == [0]
    return sub


def collect(sub, until, timeout: float = 5.0) -> list[tuple[int, KVEventBatch]]:
    got: list = []
    deadline = time.monotonic() + timeout
    while not until(got):
        assert time.monotonic() < deadline, f"got {[s for s, _ in got]}"
        got += sub.poll(20)
    return got


def test_dropped_batches_are_replayed(faulty_kv_publisher):
    pub = faulty_kv_publisher()
    with live(pub) as sub:
        pub.drop(2)
        for i in range(1, 5):
            pub.publish(batch(i))
        got = collect(sub, lambda g: g and g[-1][0] == 4)
    assert [s for s, _ in got] == [1, 2, 3, 4]
    assert 1 not in pub.sent and 2 not in pub.sent
    assert GapFilled(1, 2) in sub.notices


def test_history_dropped_from_replay_too_is_reported_lost(faulty_kv_publisher):
    pub = faulty_kv_publisher()
    with live(pub) as sub:
        pub.drop(1, from_replay=True)
        for i in range(1, 4):
            pub.publish(batch(i))
        got = collect(sub, lambda g: g and g[-1][0] == 3)
    assert [s for s, _ in got] == [2, 3]
    assert any(isinstance(n, HistoryLost) and n.expected == 1 for n in sub.notices)


def test_duplicates_are_delivered_once(faulty_kv_publisher):
    pub = faulty_kv_publisher()
    with live(pub) as sub:
        pub.duplicate(2)
        for i in range(1, 4):
            pub.publish(batch(i))
        got = collect(sub, lambda g: g and g[-1][0] == 3)
        got += sub.poll(100)
    assert pub.sent.count(1) == 2 and pub.sent.count(2) == 2
    assert [s for s, _ in got] == [1, 2, 3]


def test_held_and_reordered_batches_arrive_in_order(faulty_kv_publisher):
    pub = faulty_kv_publisher()
    with live(pub) as sub:
        pub.hold(3)
        for i in range(1, 4):
            pub.publish(batch(i))
        assert sub.poll(100) == []  # delayed: nothing yet
        pub.release(reverse=True)
        got = collect(sub, lambda g: g and g[-1][0] == 3)
        got += sub.poll(100)
    assert pub.sent[-3:] == [3, 2, 1]
    assert [s for s, _ in got] == [1, 2, 3]
    assert [b.ts for _, b in got] == [1.0, 2.0, 3.0]


def test_a_restart_is_noticed_and_the_new_stream_starts_with_cleared(faulty_kv_publisher):
    pub = faulty_kv_publisher()
    with live(pub, epoch_check_interval=0.05) as sub:
        for i in range(1, 10):
            pub.publish(batch(i))
        collect(sub, lambda g: g and g[-1][0] == 9)
        pub.restart()  # seq 0: AllBlocksCleared
        for i in range(1, 3):
            pub.publish(batch(100 + i))
        got = collect(sub, lambda g: g and g[-1][0] == 2)
    assert any(isinstance(n, PublisherRestarted) and n.last_seq == 9 for n in sub.notices)
    assert got[0] == (0, KVEventBatch(0.0, [AllBlocksCleared()], 0))
    assert [s for s, _ in got] == [0, 1, 2]


def test_a_burst_past_the_hwm_is_recovered_through_replay(faulty_kv_publisher):
    config = KvEventsConfig(
        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", hwm=10
    )
    pub = faulty_kv_publisher(config)
    with live(pub, hwm=10) as sub:
        pub.burst(KVEventBatch(float(i), [], 0) for i in range(1, 3001))
        pub.publish(batch(3001))
        got = collect(sub, lambda g: g and g[-1][0] == 3001, timeout=10)
    assert [s for s, _ in got] == list(range(1, 3002))


def refusal(make, config: KvEventsConfig, error: type[Exception] = ValueError) -> str:
    with pytest.raises(error) as caught:
        make(config)
    return str(caught.value)


@pytest.mark.parametrize(
    "endpoints",
    [
        {"endpoint": "tcp://0.0.0.0:0"},
        {"endpoint": "tcp://*:0"},
        {"endpoint": "tcp://127.0.0.1:0", "replay_endpoint": "tcp://0.0.0.0:0"},
        {"endpoint": "udp://127.0.0.1:5557"},
        {"endpoint": "tcp://127.0.0.1"},
    ],
)
def test_endpoints_are_refused_as_the_real_publisher_refuses_them(endpoints, faulty_kv_publisher):
    config = KvEventsConfig(**endpoints)
    expected = refusal(ZmqEventPublisher, config)
    assert refusal(faulty_kv_publisher, config) == expected
    assert "refusing to bind" in expected or "endpoint" in expected


def test_a_taken_port_is_the_same_error_as_the_real_publisher(faulty_kv_publisher):
    taken = faulty_kv_publisher()
    config = KvEventsConfig(endpoint=taken.endpoint)
    expected = refusal(ZmqEventPublisher, config, OSError)
    assert refusal(faulty_kv_publisher, config, OSError) == expected
    assert taken.endpoint in expected


def test_allow_remote_binds_every_interface(faulty_kv_publisher):
    config = KvEventsConfig(
        endpoint="tcp://0.0.0.0:0", replay_endpoint="tcp://0.0.0.0:0", allow_remote=True
    )
    pub = faulty_kv_publisher(config)
    assert pub.endpoint.startswith("tcp://0.0.0.0:")
    assert pub.replay_endpoint.startswith("tcp://0.0.0.0:")
    loopback = pub.endpoint.replace("0.0.0.0", "127.0.0.1")
    with KvEventSubscriber(loopback) as sub:
        pub.wait_subscribed()
        pub.publish(batch(0))
        assert [s for s, _ in collect(sub, lambda g: g)] == [0]


def test_a_rank_publishes_where_the_real_publisher_of_that_rank_would(
    faulty_kv_publisher, tmp_path
):
    config = KvEventsConfig(
        endpoint=f"ipc://{tmp_path}/events", replay_endpoint=f"ipc://{tmp_path}/replay"
    )
    real = ZmqEventPublisher(config, dp_rank=2)
    try:
        expected = (real.endpoint, real.replay_endpoint)
    finally:
        real.shutdown()
    pub = faulty_kv_publisher(config, dp_rank=2)
    assert (pub.endpoint, pub.replay_endpoint) == expected
    pub.restart()  # binds again where it was, not one rank further
    assert pub.replay_endpoint == expected[1]


def test_a_connecting_publisher_reaches_a_bound_subscriber(faulty_kv_publisher):
    payload = encode_batch(batch(0))
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.bind("tcp://127.0.0.1:0")
        endpoint = sub.getsockopt(zmq.LAST_ENDPOINT).decode()
        pub = faulty_kv_publisher(KvEventsConfig(endpoint=endpoint, mode="connect"))
        assert pub.endpoint == endpoint
        deadline = time.monotonic() + 5
        while not sub.poll(20):  # the connection comes up in the background
            assert time.monotonic() < deadline
            pub.publish_raw(payload)
        topic, _seq, received = sub.recv_multipart()
        assert (topic, received) == (b"", payload)
    finally:
        sub.close(linger=0)
        context.term()


# A FaultyPublisher alone in a fresh process, where libc's rand() starts where it starts in
# every process; it prints its replay endpoint and runs until its stdin closes.
FAULTY_PUBLISHER = """
import sys
from schedkit.kv_events import KVEventBatch
from schedkit.testing.faults import FaultyPublisher
pub = FaultyPublisher()
for i in range(3):
    pub.publish(KVEventBatch(float(i), []))
print("replay_endpoint", pub.replay_endpoint, flush=True)
sys.stdin.read()
pub.shutdown()
"""


def test_a_client_taking_the_next_automatic_routing_id_does_not_kill_it():
    survives_a_client_taking_the_next_automatic_routing_id(FAULTY_PUBLISHER)


def test_its_replay_socket_queues_a_whole_replay_for_a_client(faulty_kv_publisher):
    # libzmq's default (1000) would drop a client reading a longer replay slowly as stalled.
    pub = faulty_kv_publisher(
        KvEventsConfig(
            endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", buffer_steps=5000
        )
    )
    for _ in range(2):  # and again after a restart
        assert pub._replay._router.getsockopt(zmq.SNDHWM) == replay_send_hwm(5000) > 5000
        pub.restart()
