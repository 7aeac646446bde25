"""The publisher's sockets: endpoints offset by DP rank, checked (loopback unless allowed) and
named when they fail, connect mode, and nothing left open when the replay socket fails."""

from __future__ import annotations

import time

import pytest
import zmq

from schedkit.kv_events import KvEventsConfig, ZmqEventPublisher, decode_batch
from tests.schedkit.kv_events.helpers import batch, config, subscriber_for, wait_live


def test_dp_rank_offsets_the_endpoints(tmp_path, closing):
    base = f"ipc://{tmp_path}/kv"
    pub = closing(
        ZmqEventPublisher(KvEventsConfig(endpoint=base, replay_endpoint=f"{base}-replay"), 2)
    )
    assert pub.endpoint == f"{base}_dp2"
    assert pub.replay_endpoint == f"{base}-replay_dp2"
    sub = closing(subscriber_for(pub))
    got = wait_live(pub, sub)
    assert got[-1][1].attn_dp_rank == 2


def test_bind_failure_names_the_endpoint(closing):
    pub = closing(ZmqEventPublisher(config()))
    with pytest.raises(OSError, match=f"cannot bind to {pub.endpoint}"):
        ZmqEventPublisher(KvEventsConfig(endpoint=pub.endpoint))


def test_connect_mode_publishes_to_a_binding_subscriber(closing):
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    try:
        pub = closing(
            ZmqEventPublisher(KvEventsConfig(endpoint=f"tcp://127.0.0.1:{port}", mode="connect"))
        )
        deadline = time.monotonic() + 5
        while not sub.poll(20):
            assert time.monotonic() < deadline
            pub.publish(batch(7))
        topic, seq, payload = sub.recv_multipart()
    finally:
        sub.close()
    assert topic == b"" and len(seq) == 8 and decode_batch(payload).ts == 7.0


def test_a_failed_replay_bind_closes_the_pub_socket_it_opened(closing):
    taken = closing(ZmqEventPublisher(config(replay=True)))
    context = zmq.Context()
    try:
        refused = KvEventsConfig(endpoint="inproc://kv-pub", replay_endpoint=taken.replay_endpoint)
        with pytest.raises(OSError, match=f"cannot bind to {taken.replay_endpoint}") as info:
            ZmqEventPublisher(refused, context=context)
        # The traceback (kept in info) holds the sockets' frame: only a close frees the name,
        # which libzmq's reaper thread does soon after the close returns.
        deadline = time.monotonic() + 10
        while True:
            try:
                pub = ZmqEventPublisher(KvEventsConfig(endpoint="inproc://kv-pub"), context=context)
                break
            except OSError:
                assert time.monotonic() < deadline, "the failed publisher kept its PUB endpoint"
                time.sleep(0.01)
        pub.shutdown(timeout=1.0)
        assert info.traceback
    finally:
        context.destroy(linger=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"endpoint": "tcp://0.0.0.0:0"},
        {"endpoint": "tcp://*:0"},
        {"endpoint": "tcp://127.0.0.1:0", "replay_endpoint": "tcp://0.0.0.0:0"},
    ],
)
def test_wildcard_binds_are_refused_unless_allowed(kwargs):
    with pytest.raises(ValueError, match=r"not a loopback address.*allow_remote: true"):
        ZmqEventPublisher(KvEventsConfig(**kwargs))


def test_connect_mode_may_name_any_host(closing):
    sink = zmq.Context.instance().socket(zmq.SUB)
    sink.setsockopt(zmq.LINGER, 0)
    port = sink.bind_to_random_port("tcp://127.0.0.1")
    try:
        pub = closing(
            ZmqEventPublisher(KvEventsConfig(endpoint=f"tcp://localhost:{port}", mode="connect"))
        )
        assert pub.endpoint.endswith(str(port))
    finally:
        sink.close()
