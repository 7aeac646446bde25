import threading
import time

import msgspec
import pytest
import zmq
from schedkit.components.io_struct import (
    ControlReply,
    ControlReq,
    ControlRequest,
    GenerateReqInput,
    SamplingParamsInput,
    decode_reply,
    encode,
)
from schedkit.components.request_receiver import InprocRequestReceiver, ZmqRequestReceiver
from schedkit.components.schedule_batch import Req
from structlog.testing import capture_logs

from schedkit.component import component_name


def test_registered_names():
    assert component_name(InprocRequestReceiver) == "inproc_request_receiver"
    assert component_name(ZmqRequestReceiver) == "zmq_request_receiver"


def test_inproc_receiver_drains_in_arrival_order():
    receiver = InprocRequestReceiver()
    assert receiver.recv_requests() == []
    a, b = Req(rid="a", origin_input_ids=[1]), Req(rid="b", origin_input_ids=[2])
    pause = ControlRequest(type="pause", mode="in_place")
    for item in (a, pause, b):
        receiver.put(item)
    assert receiver.recv_requests() == [a, pause, b]
    assert receiver.recv_requests() == []


def test_inproc_receiver_rejects_other_objects():
    receiver = InprocRequestReceiver()
    with pytest.raises(TypeError, match="Req or a ControlRequest, got dict"):
        receiver.put({"rid": "a"})


def test_inproc_receiver_wait_wakes_on_put_from_another_thread():
    receiver = InprocRequestReceiver()
    assert receiver.wait(0.01) is False
    req = Req(rid="a", origin_input_ids=[1])
    timer = threading.Timer(0.05, receiver.put, args=(req,))
    timer.start()
    start = time.monotonic()
    assert receiver.wait(5.0) is True
    assert time.monotonic() - start < 4.0
    assert receiver.recv_requests() == [req]
    assert receiver.wait(0.0) is False
    timer.join()


def test_inproc_receiver_close_drops_queued_items():
    receiver = InprocRequestReceiver()
    receiver.put(Req(rid="a", origin_input_ids=[1]))
    receiver.close()
    assert receiver.recv_requests() == []


@pytest.fixture
def receiver():
    receiver = ZmqRequestReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def client(receiver):
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.RCVTIMEO, 5000)
    socket.connect(receiver.bound_endpoint)
    yield socket
    socket.close(linger=0)


def recv_until(receiver, count, timeout=5.0):
    """Poll recv_requests until ``count`` items arrived (the sockets are asynchronous)."""
    items = []
    deadline = time.monotonic() + timeout
    while len(items) < count and time.monotonic() < deadline:
        receiver.wait(0.05)
        items.extend(receiver.recv_requests())
    return items


def test_zmq_receiver_binds_a_free_loopback_port(receiver):
    assert receiver.bound_endpoint.startswith("tcp://127.0.0.1:")
    assert not receiver.bound_endpoint.endswith(":0")


def test_zmq_receiver_refuses_to_bind_a_remote_address():
    with pytest.raises(ValueError, match="loopback"):
        ZmqRequestReceiver(endpoint="tcp://0.0.0.0:0")


def test_zmq_receiver_is_non_blocking_when_nothing_arrived(receiver):
    start = time.monotonic()
    assert receiver.recv_requests() == []
    assert time.monotonic() - start < 0.5


def test_zmq_receiver_decodes_generate_requests(receiver, client):
    client.send(
        encode(
            GenerateReqInput(
                rid="r1",
                input_ids=[3, 4, 5],
                sampling_params=SamplingParamsInput(max_new_tokens=7, stream=True),
            )
        )
    )
    client.send(encode(GenerateReqInput(rid="r2", input_ids=[9])))
    items = recv_until(receiver, 2)
    assert [type(item) for item in items] == [Req, Req]
    first, second = items
    assert (first.rid, first.origin_input_ids) == ("r1", [3, 4, 5])
    assert (first.sampling_params.max_new_tokens, first.sampling_params.stream) == (7, True)
    assert (second.rid, second.sampling_params.max_new_tokens) == ("r2", 128)


def test_zmq_receiver_control_reply_goes_back_to_the_asking_client(receiver, client):
    other = zmq.Context.instance().socket(zmq.DEALER)
    other.connect(receiver.bound_endpoint)
    try:
        client.send(encode(ControlReq(type="get_loads")))
        other.send(encode(ControlReq(type="pause", mode="in_place")))
        items = recv_until(receiver, 2)
        by_type = {item.type: item for item in items}
        assert set(by_type) == {"get_loads", "pause"}
        assert by_type["pause"].mode == "in_place"
        by_type["get_loads"].reply({"num_running_reqs": 4})
        by_type["pause"].reply()
        reply = decode_reply(client.recv())
        assert reply == ControlReply(type="get_loads", ok=True, loads={"num_running_reqs": 4})
        other.setsockopt(zmq.RCVTIMEO, 5000)
        assert decode_reply(other.recv()) == ControlReply(type="pause", ok=True)
    finally:
        other.close(linger=0)


def test_zmq_receiver_answers_req_clients_with_their_envelope(receiver):
    req_socket = zmq.Context.instance().socket(zmq.REQ)
    req_socket.setsockopt(zmq.RCVTIMEO, 5000)
    req_socket.connect(receiver.bound_endpoint)
    try:
        req_socket.send(encode(ControlReq(type="flush")))
        (control,) = recv_until(receiver, 1)
        control.reply(True)
        assert decode_reply(req_socket.recv()) == ControlReply(type="flush", ok=True)
    finally:
        req_socket.close(linger=0)


@pytest.mark.parametrize(
    "frames, problem",
    [
        ([b"\xc1"], "MessagePack data is malformed"),
        ([msgspec.msgpack.encode([1, 2, 3])], "Expected `object`, got `array`"),
        ([msgspec.msgpack.encode({"kind": "generate", "rid": "x"})], "missing required field"),
        (
            [msgspec.msgpack.encode({"kind": "generate", "rid": "x", "input_ids": [-3]})],
            "Expected `int` >= 0",
        ),
        ([msgspec.msgpack.encode({"kind": "control", "type": "reboot"})], "Invalid enum value"),
        ([b"a", b"b"], "expected [identity, payload] frames, got 3 frames"),
    ],
)
def test_zmq_receiver_logs_and_skips_malformed_messages(receiver, client, frames, problem):
    with capture_logs() as logs:
        client.send_multipart(frames)
        client.send(encode(GenerateReqInput(rid="good", input_ids=[1])))
        items = recv_until(receiver, 1)
    assert [item.rid for item in items] == ["good"]
    assert receiver.malformed_count == 1
    (entry,) = [log for log in logs if log["event"] == "malformed request skipped"]
    assert entry["log_level"] == "warning"
    assert problem in entry["problem"]


def test_zmq_receiver_caps_messages_per_call():
    receiver = ZmqRequestReceiver(max_recv_per_call=2)
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.connect(receiver.bound_endpoint)
    try:
        for i in range(5):
            client.send(encode(GenerateReqInput(rid=f"r{i}", input_ids=[i])))
        assert receiver.wait(5.0)
        time.sleep(0.05)  # let all five frames reach the ROUTER's queue
        assert len(receiver.recv_requests()) == 2
        rest = recv_until(receiver, 3)
        assert [item.rid for item in rest] == ["r2", "r3", "r4"]
    finally:
        client.close(linger=0)
        receiver.close()


def test_zmq_receiver_after_close_returns_nothing_and_drops_replies(receiver, client):
    client.send(encode(ControlReq(type="pause")))
    (control,) = recv_until(receiver, 1)
    receiver.close()
    assert receiver.recv_requests() == []
    assert receiver.wait(0.01) is False
    with capture_logs() as logs:
        control.reply()
    assert logs[0]["event"] == "control reply dropped: socket closed"


def test_zmq_receiver_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_recv_per_call"):
        ZmqRequestReceiver(max_recv_per_call=0)
