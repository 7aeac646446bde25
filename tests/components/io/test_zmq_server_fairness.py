"""ZmqServer in the default assembly on the virtual clock, counted in scheduler steps: a small
request behind another client's flood of 1,000 requests finishes within twice the steps it takes
alone plus one, and the flood cannot take the whole waiting budget."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq
from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    ErrorReply,
    GenerateReqInput,
    SamplingParamsInput,
    decode_server_message,
    encode,
)

import schedkit
from schedkit.assembly.wiring import Ref

WIRING = Path(__file__).resolve().parents[3] / "wiring.yaml"


def serve_overlay(**server_args: object) -> dict:
    kv = {"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": "kv-events"}
    return {
        "components": {
            "request_receiver": {"type": "zmq_server", "args": server_args},
            "output_sender": None,
            "output_streamer": {"args": {"sender": Ref("ref", "request_receiver")}},
            "kv_events_publisher": {"args": {"kv_events_config": kv}},
        }
    }


@pytest.fixture
def served():
    built = []

    def served(**server_args: object):
        assembly = schedkit.build(schedkit.load_wiring(WIRING, serve_overlay(**server_args)))
        built.append(assembly)
        return assembly, assembly["request_receiver"].bound_endpoint

    yield served
    for assembly in built:
        assembly.shutdown()


class Dealer:
    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.finished: set[str] = set()
        self.refused = 0

    def send(self, rid: str, ids: list[int], new: int) -> None:
        params = SamplingParamsInput(max_new_tokens=new)
        self.sock.send(encode(GenerateReqInput(rid=rid, input_ids=ids, sampling_params=params)))

    def pump(self) -> None:
        while self.sock.poll(0):
            msg = decode_server_message(self.sock.recv())
            if isinstance(msg, ErrorReply):
                self.refused += 1
            elif isinstance(msg, BatchTokenIDOutput):
                self.finished.update(
                    r for r, f in zip(msg.rids, msg.finished_reasons, strict=True) if f
                )

    def close(self) -> None:
        self.sock.close()


def steps_until(scheduler, done, limit: int = 5000) -> int:
    """Step the scheduler until ``done()``; the steps it took."""
    for steps in range(1, limit + 1):
        if not scheduler.step():
            time.sleep(0.001)  # idle: let the sockets deliver
        if done():
            return steps
    raise AssertionError(f"not done in {limit} steps")


def handshaken(scheduler, clients: int) -> None:
    """Step the scheduler until its server has finished the handshakes of ``clients``
    connections; from then on, bytes to read on one are a message."""
    server = scheduler.request_receiver
    deadline = time.monotonic() + 30.0
    while len(server.connections) < clients or not all(
        conn.reader.ready for conn in server.connections
    ):
        assert time.monotonic() < deadline, "the clients never finished their handshakes"
        if not scheduler.step():
            time.sleep(0.001)


def small_request_steps(scheduler, client: Dealer, rid: str) -> int:
    """The scheduler steps from a small request's arrival at the server to its end (its final
    output handed to the server). Its way through the sockets takes no step: on a busy machine
    a loaded scheduler would count many while the bytes travel."""
    server = scheduler.request_receiver
    steps, finished_at = 0, []
    wired = scheduler.on_finish

    def on_finish(req) -> None:
        if req.rid == rid:
            finished_at.append(steps)
        wired(req)

    scheduler.on_finish = on_finish
    try:
        client.send(rid, [5] * 50 + [9] * 10, 16)
        deadline = time.monotonic() + 30.0
        while not server.connections.poll(0.05):  # handshakes done: only this client sends
            assert time.monotonic() < deadline, "the request never reached the server"
        while not finished_at:
            steps += 1
            assert steps <= 5000, f"{rid} not done in 5000 steps"
            if not scheduler.step():
                time.sleep(0.001)  # idle: let the sockets deliver
    finally:
        scheduler.on_finish = wired

    def received() -> bool:
        client.pump()
        return rid in client.finished

    steps_until(scheduler, received)
    return finished_at[0]


def test_a_small_request_behind_a_flood_of_1000_takes_at_most_twice_its_steps_plus_one(served):
    assembly, endpoint = served()
    scheduler = assembly["scheduler"]
    small, flood = Dealer(endpoint), Dealer(endpoint)
    try:
        handshaken(scheduler, 2)
        idle = small_request_steps(scheduler, small, "idle")
        for i in range(1000):  # distinct 32k-token prompts: nothing cached
            flood.send(f"f{i}", list(range(i * 40_000 + 10, i * 40_000 + 10 + (32 << 10))), 128)
        steps_until(scheduler, lambda: flood.pump() or flood.refused >= 1000 - 32)
        behind = small_request_steps(scheduler, small, "behind")
        assert behind <= 2 * idle + 1, (idle, behind)
    finally:
        small.close()
        flood.close()


def test_a_client_under_its_fair_share_displaces_the_largest_clients_newest_held_request(
    served,
):
    assembly, endpoint = served(max_waiting_requests=8)
    scheduler = assembly["scheduler"]
    hog, other = Dealer(endpoint), Dealer(endpoint)
    try:
        for i in range(8):  # two go to the scheduler (release_tokens_per_client), six wait
            hog.send(f"h{i}", list(range(i * 10_000 + 10, (i + 1) * 10_000 + 10)), 64)
        server = assembly["request_receiver"]
        steps_until(scheduler, lambda: server.live_requests == 8)
        other.send("o", [6] * 30, 4)

        def done() -> bool:
            hog.pump()
            other.pump()
            return "o" in other.finished

        steps_until(scheduler, done)
        assert other.refused == 0 and hog.refused == 1
        assert server.displaced_requests == 1
    finally:
        hog.close()
        other.close()
