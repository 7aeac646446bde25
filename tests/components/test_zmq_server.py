"""ZmqServer alone, over real loopback sockets: routing, refusals, slow and gone clients."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq
from schedkit.components.io_struct import (
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    ControlRequest,
    ErrorReply,
    FinishLength,
    GenerateReqInput,
    decode_server_message,
    encode,
)
from schedkit.components.schedule_batch import Req
from schedkit.components.zmq_server import ZmqServer

from schedkit.component import component_name


@pytest.fixture
def server():
    srv = ZmqServer(max_queued_per_client=4)
    yield srv
    srv.close()


@pytest.fixture
def connect(server):
    sockets = []

    def connect(**options) -> zmq.Socket:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name), value)
        sock.connect(server.bound_endpoint)
        sockets.append(sock)
        return sock

    yield connect
    for sock in sockets:
        sock.close()


def receive(server, want: int, timeout: float = 5.0) -> list:
    items, deadline = [], time.monotonic() + timeout
    while len(items) < want:
        assert time.monotonic() < deadline, f"got {items}"
        server.wait(0.05)
        items += server.recv_requests()
    return items


def read(sock: zmq.Socket, timeout: float = 5.0):
    assert sock.poll(int(timeout * 1000)), "nothing arrived"
    return decode_server_message(sock.recv())


def generate(rid: str, ids=(1, 2, 3), **kwargs) -> bytes:
    return encode(GenerateReqInput(rid=rid, input_ids=list(ids), **kwargs))


def output(rids: list[str], finished: bool = False, tokens: int = 1) -> BatchTokenIDOutput:
    n = len(rids)
    return BatchTokenIDOutput(
        rids=rids,
        finished_reasons=[FinishLength(tokens) if finished else None] * n,
        output_ids=[[7] * tokens for _ in rids],
        prompt_tokens=[3] * n,
        completion_tokens=[tokens] * n,
        cached_tokens=[0] * n,
        cached_tokens_details=[None] * n,
    )


def test_registered_as_zmq_server():
    assert component_name(ZmqServer) == "zmq_server"


def test_refuses_a_non_loopback_bind():
    with pytest.raises(ValueError, match="allow_remote"):
        ZmqServer(endpoint="tcp://0.0.0.0:0")


def test_each_client_gets_only_its_own_outputs(server, connect):
    a, b, bystander = connect(), connect(), connect()
    a.send(generate("a1"))
    b.send(generate("b1"))
    reqs = receive(server, 2)
    assert sorted(r.rid for r in reqs) == ["a1", "b1"] and all(isinstance(r, Req) for r in reqs)
    server.send(output(["a1", "b1"]))
    server.send(output(["b1", "a1"], finished=True))
    got_a = [read(a), read(a)]
    got_b = [read(b), read(b)]
    assert [m.rids for m in got_a] == [["a1"], ["a1"]]
    assert [m.rids for m in got_b] == [["b1"], ["b1"]]
    assert got_a[1].finished_reasons == [FinishLength(1)]
    assert not bystander.poll(200)
    assert server.live_requests == 0  # finished requests are forgotten


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"\xc1garbage", "valid messages: GenerateReqInput"),
        (generate("big", [1, 2**32]), "at `$.input_ids[1]`"),
        (generate("neg", [-1]), "at `$.input_ids[0]`"),
        (
            encode(
                {
                    "kind": "generate",
                    "rid": "s",
                    "input_ids": [1],
                    "sampling_params": {"stop_token_ids": list(range(1000))},
                }
            ),
            "at `$.sampling_params.stop_token_ids`",
        ),
        (encode({"kind": "generate", "rid": "", "input_ids": [1]}), "at `$.rid`"),
        (encode({"kind": "nope"}), "Invalid value 'nope'"),
        (encode({"kind": "control", "type": "abort", "rid": "not-mine"}), "your live requests"),
    ],
)
def test_bad_messages_get_an_error_reply_naming_the_field(server, connect, payload, problem):
    client = connect()
    client.send(payload)
    deadline = time.monotonic() + 5
    while not client.poll(10):
        assert time.monotonic() < deadline
        assert server.recv_requests() == []
    reply = read(client)
    assert isinstance(reply, ErrorReply) and problem in reply.message, reply
    assert server.malformed_count == 1


def test_a_rid_in_flight_is_refused_and_freed_once_finished(server, connect):
    client = connect()
    client.send(generate("r"))
    receive(server, 1)
    client.send(generate("r"))
    queued = []
    deadline = time.monotonic() + 5
    while not client.poll(10):
        assert time.monotonic() < deadline
        queued += server.recv_requests()
    assert queued == []  # the refusal is answered, not queued
    reply = read(client)
    assert reply == ErrorReply(message="rid 'r' is already in flight", rid="r")
    server.send(output(["r"], finished=True))
    read(client)
    client.send(generate("r"))
    assert [x.rid for x in receive(server, 1)] == ["r"]


def test_multi_frame_messages_are_refused(server, connect):
    client = connect()
    client.send_multipart([b"a", b"b"])
    deadline = time.monotonic() + 5
    while not client.poll(10):
        assert time.monotonic() < deadline
        server.recv_requests()
    assert "expected one message frame" in read(client).message


def test_control_replies_go_to_the_asker(server, connect):
    asker, other = connect(), connect()
    asker.send(encode(ControlReq(type="get_loads")))
    (item,) = receive(server, 1)
    assert isinstance(item, ControlRequest) and item.type == "get_loads"
    item.reply({"num_running_reqs": 0})
    assert read(asker) == ControlReply(type="get_loads", ok=True, loads={"num_running_reqs": 0})
    assert not other.poll(100)


def test_a_client_that_stops_reading_is_dropped_and_its_requests_aborted(server, connect):
    slow = connect(RCVHWM=1, RCVBUF=1024)
    slow.send(generate("s1"))
    slow.send(generate("s2"))
    receive(server, 2)
    sends = 0
    while server.clients_dropped == 0:
        assert sends < 10_000, "the slow client was never dropped"
        server.send(output(["s1", "s2"], tokens=2000))  # and the client never reads
        sends += 1
    aborts = server.recv_requests()
    assert sorted((a.type, a.rid) for a in aborts) == [("abort", "s1"), ("abort", "s2")]
    assert server.live_requests == 0


def test_a_client_that_disconnected_has_its_requests_aborted(server, connect):
    gone = connect()
    gone.send(generate("g"))
    receive(server, 1)
    gone.close()
    deadline = time.monotonic() + 5
    while server.clients_dropped == 0:  # the next output finds it gone
        assert time.monotonic() < deadline
        server.send(output(["g"]))
        time.sleep(0.01)
    assert [(a.type, a.rid) for a in server.recv_requests()] == [("abort", "g")]


def test_outputs_of_requests_it_did_not_take_are_dropped_and_counted(server):
    server.send(output(["inproc"], finished=True))  # nobody to send them to; nothing raised
    server.send(output(["a", "b"]))
    assert server.live_requests == 0
    assert server.unrouted_outputs == 3


def test_error_reply_decodes_with_plain_msgpack(server, connect):
    client = connect()
    client.send(b"\x00")
    deadline = time.monotonic() + 5
    while not client.poll(10):
        assert time.monotonic() < deadline
        server.recv_requests()
    raw = msgspec.msgpack.decode(client.recv())
    assert raw["kind"] == "error" and "message" in raw


def test_takes_at_most_max_recv_per_call_messages_per_call(connect):
    server = ZmqServer(max_recv_per_call=2)
    try:
        client = zmq.Context.instance().socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        client.connect(server.bound_endpoint)
        for i in range(5):
            client.send(generate(f"r{i}"))
        assert server.wait(5.0)
        time.sleep(0.05)  # let all five frames reach the ROUTER's queue
        assert len(server.recv_requests()) == 2
        assert [r.rid for r in receive(server, 3)] == ["r2", "r3", "r4"]
        client.close()
    finally:
        server.close()


def test_after_close_nothing_is_taken_and_replies_go_nowhere(server, connect):
    client = connect()
    client.send(encode(ControlReq(type="pause")))
    (control,) = receive(server, 1)
    server.close()
    assert server.recv_requests() == []
    assert server.wait(0.01) is False
    control.reply(None)  # nothing to send on: dropped, no error
    server.send(output(["x"]))


def test_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_recv_per_call must be an integer >= 1"):
        ZmqServer(max_recv_per_call=0)
