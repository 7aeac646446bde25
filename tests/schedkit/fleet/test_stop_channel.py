from __future__ import annotations

import time

import zmq

from schedkit.fleet.stop_channel import StopChannel
from schedkit.fleet.worker import WorkerSpec, connect_stop


def subscriber(context: zmq.Context, channel: StopChannel, rank: int) -> zmq.Socket:
    """Worker ``rank``'s stop SUB, once the channel has its subscription."""
    spec = WorkerSpec("w.yaml", (), rank, 11, "tcp://127.0.0.1:1", channel.endpoint)
    sub = connect_stop(context, spec)
    deadline = time.monotonic() + 10
    while rank not in channel.subscribed and time.monotonic() < deadline:
        channel.socket.poll(50)
        channel.take_subscriptions()
    assert rank in channel.subscribed
    return sub


def test_each_worker_gets_its_own_stop_also_when_it_subscribes_late():
    context = zmq.Context()
    channel = StopChannel(context, 11)
    one = subscriber(context, channel, 1)
    channel.stop_all()
    assert one.poll(5000) and one.recv() == b"stop 1\n"
    ten = subscriber(context, channel, 10)  # subscribed after the stop: sent it on arrival
    assert ten.poll(5000) and ten.recv() == b"stop 10\n"
    # Rank 10's stop did not reach rank 1 (no topic is a prefix of another), and a stop goes
    # out once.
    channel.stop_all()
    assert not one.poll(100) and not ten.poll(0)
    assert channel.sent == {1, 10}
    for sock in (one, ten):
        sock.close(linger=0)
    channel.close()
    context.term()
