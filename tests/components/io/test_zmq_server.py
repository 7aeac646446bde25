"""ZmqServer alone, over real loopback sockets: routing, refusals, slow and gone clients."""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
from array import array

import msgspec
import pytest
import zmq

from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    ControlRequest,
    ErrorReply,
    FinishLength,
    GenerateReqInput,
    SamplingParamsInput,
    decode_server_message,
    encode,
)
from schedkit.components.io.zmq_server import ZmqServer
from schedkit.core.component import component_name
from schedkit.core.schedule_batch import Req


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


def admitted(items: list) -> list:
    """``items``, each request marked admitted into a batch, as a scheduler would."""
    for item in items:
        if isinstance(item, Req):
            item.scheduled_time = time.monotonic()
    return items


def receive(server, want: int, timeout: float = 5.0) -> list:
    items, deadline = [], time.monotonic() + timeout
    while len(items) < want:
        assert time.monotonic() < deadline, f"got {items}"
        server.wait(0.05)
        items += admitted(server.recv_requests())
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


def test_a_req_socket_is_told_to_connect_a_dealer(server):
    # REQ puts an empty delimiter before the message and reads only answers that carry one.
    req = zmq.Context.instance().socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    try:
        req.connect(server.bound_endpoint)
        req.send(encode(ControlReq(type="get_loads")))
        deadline = time.monotonic() + 5
        while not req.poll(10):
            assert time.monotonic() < deadline, "the REQ socket got no answer"
            assert server.recv_requests() == []
        reply = decode_server_message(req.recv())
        assert isinstance(reply, ErrorReply)
        assert "connect a DEALER" in reply.message and "REQ" in reply.message
    finally:
        req.close()


def test_a_message_of_many_frames_closes_its_connection_without_holding_them(server, connect):
    client = connect()
    client.send_multipart([b"x"] * 50_000)
    other = connect()
    other.send(generate("other"))
    tracemalloc.start()
    assert [r.rid for r in receive(server, 1)] == ["other"]
    deadline = time.monotonic() + 10
    while server.connections.closed_for_bounds == 0:
        assert time.monotonic() < deadline
        server.wait(0.05)
        assert server.recv_requests() == []
    assert python_peak_bytes() < 4 << 20  # 50,000 frames held at once: ~9 MiB
    assert len(server.connections) == 1  # the other one


def test_a_message_of_a_few_frames_is_refused(server, connect):
    client = connect()
    client.send_multipart([b"x"] * 64)  # max_frames_per_message
    deadline = time.monotonic() + 5
    while not client.poll(10):
        assert time.monotonic() < deadline
        assert server.recv_requests() == []
    assert read(client).message == "expected one message frame from a DEALER, got 64"


def test_a_refusal_quotes_a_huge_value_shortened_so_unread_refusals_stay_small(server, connect):
    # A client that never reads would otherwise have each of its huge values queued back.
    client = connect()
    params = {"max_new_tokens": 1, "x" * (1 << 20): 1}
    client.send(
        msgspec.msgpack.encode(
            {"kind": "generate", "rid": "r", "input_ids": [1], "sampling_params": params}
        )
    )
    deadline = time.monotonic() + 5
    while not client.poll(10):
        assert time.monotonic() < deadline
        assert server.recv_requests() == []
    reply = read(client)
    assert len(reply.message) <= 1000 and reply.rid == "r"
    assert reply.message.startswith("Object contains unknown field `xxx")
    assert "characters left out" in reply.message
    assert "at `$.sampling_params`; valid messages: GenerateReqInput" in reply.message


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
    assert server.live_requests == 2  # the rids stay taken until their final outputs
    server.send(output(["s1", "s2"], finished=True))
    assert server.live_requests == 0 and server.departed_outputs == 2


def wait_for_aborts(server, want: int, timeout: float = 5.0) -> list:
    """Step the server (receiving, never sending) until ``want`` aborts came out."""
    aborts, deadline = [], time.monotonic() + timeout
    while len(aborts) < want:
        assert time.monotonic() < deadline, f"got {aborts}"
        server.wait(0.05)
        aborts += [x for x in server.recv_requests() if isinstance(x, ControlRequest)]
    return aborts


def test_a_client_that_disconnected_has_its_requests_aborted_when_it_leaves(server, connect):
    gone = connect()
    gone.send(generate("g"))
    receive(server, 1)
    gone.close()
    # No output is sent: the closed connection alone aborts the request.
    assert [(a.type, a.rid) for a in wait_for_aborts(server, 1)] == [("abort", "g")]
    assert server.clients_dropped == 1


def drain(server, quiet: float = 0.3) -> list:
    """Everything the server hands out until nothing has come for ``quiet`` seconds."""
    items = []
    while server.wait(quiet):
        items += server.recv_requests()
    return items


@pytest.mark.parametrize("step_before_close", [True, False])
def test_requests_a_client_sent_just_before_it_left_are_dropped_or_aborted_after(
    server, step_before_close
):
    # The connection closes before (or while) its requests are read: none may run for nobody.
    gone = zmq.Context.instance().socket(zmq.DEALER)
    gone.connect(server.bound_endpoint)
    if step_before_close:  # the server knows the connection before it closes
        gone.send(encode(ControlReq(type="get_loads")))
        assert [x.type for x in receive(server, 1)] == ["get_loads"]
    rids = [f"g{i}" for i in range(20)]
    for rid in rids:
        gone.send(generate(rid, sampling_params=SamplingParamsInput(max_new_tokens=4000)))
    time.sleep(0.2)  # sent
    gone.close(linger=1000)
    time.sleep(0.3)  # and the close reported, before the server reads the requests
    items = drain(server)
    for i, item in enumerate(items):
        if isinstance(item, Req):
            later = items[i + 1 :]
            assert any(getattr(x, "type", None) == "abort" and x.rid == item.rid for x in later), (
                item.rid
            )
    taken = [x.rid for x in items if isinstance(x, Req)]
    assert server.live_requests == len(taken)  # the rest were dropped before handing over
    server.send(output(taken, finished=True))
    assert server.live_requests == 0


def test_a_newcomer_on_a_closed_connections_descriptor_is_served(server, connect):
    # The kernel hands the lowest free descriptor to the next connection: each newcomer here
    # takes the one just closed, whose leftover messages are dropped.
    for i in range(20):
        gone = connect()
        gone.send(generate(f"gone{i}"))
        receive(server, 1)
        gone.close()
        wait_for_aborts(server, 1)
        newcomer = connect()
        newcomer.send(generate(f"new{i}"))
        assert [r.rid for r in receive(server, 1)] == [f"new{i}"]
        newcomer.close()
        wait_for_aborts(server, 1)


def connect_as_departed(server, connect, identity: bytes, settle) -> tuple[zmq.Socket, list]:
    """Connect a DEALER under ``identity`` just after its owner left and send ``get_loads``;
    ``settle()`` runs between sending and reading. The server tells clients apart by their
    connections, never by the routing id they present; a connection whose message did not
    arrive within a second is replaced by a new one."""
    for _ in range(20):
        sock = connect(ROUTING_ID=identity)
        sock.send(encode(ControlReq(type="get_loads")))
        settle()
        items, deadline = [], time.monotonic() + 1.0
        while time.monotonic() < deadline and not any(x.type == "get_loads" for x in items):
            server.wait(0.05)
            items += server.recv_requests()
        if any(x.type == "get_loads" for x in items):
            return sock, items
        sock.close()
    raise AssertionError(f"a connection under {identity!r} was never taken")


@pytest.mark.parametrize("read_first", [True, False], ids=["recv-first", "send-first"])
def test_a_newcomer_with_a_departed_clients_routing_id_gets_none_of_its_outputs(
    server, connect, read_first
):
    alice = connect(ROUTING_ID=b"alice")
    rids = [f"a{i}" for i in range(20)]
    for rid in rids:
        alice.send(generate(rid))
    receive(server, 20)
    alice.close()
    aborts = []
    if read_first:
        aborts = wait_for_aborts(server, 20)
        assert sorted(a.rid for a in aborts) == sorted(rids)
    else:  # the server waits, reading nothing: it has not seen alice leave
        for _ in range(10):
            server.wait(0.02)

    def settle() -> None:
        if not read_first:  # the thief is in under alice's routing id before anything is read
            for _ in range(10):
                server.wait(0.02)
        server.send(output(rids, tokens=3))
        server.send(output(rids, finished=True))

    thief, items = connect_as_departed(server, connect, b"alice", settle)
    aborts += [x for x in items if x.type == "abort"]
    assert sorted(a.rid for a in aborts) == sorted(rids)
    (control,) = [x for x in items if x.type == "get_loads"]
    control.reply({"num_running_reqs": 0})
    assert read(thief) == ControlReply(type="get_loads", ok=True, loads={"num_running_reqs": 0})
    assert not thief.poll(200)  # none of alice's outputs
    # Outputs sent before the server read the close went to the closed socket, not the thief.
    assert server.departed_outputs == (40 if read_first else 0) and server.live_requests == 0
    thief.send(generate("a0"))  # the departed rids are free again
    assert [r.rid for r in receive(server, 1)] == ["a0"]


def python_peak_bytes() -> int:
    """The most Python allocated at once since ``tracemalloc.start()``; stops tracing.
    (Unlike the process's peak RSS, it does not hide behind what earlier tests used.)"""
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_a_frame_over_max_message_bytes_is_refused_by_its_length(connect):
    server = ZmqServer(max_message_bytes=1 << 20)
    try:
        client = zmq.Context.instance().socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        client.connect(server.bound_endpoint)
        frame = b"\xdd" + (2 << 20).to_bytes(4, "big") + b"\x90" * (2 << 20)  # 2 Mi empty arrays
        started = time.monotonic()
        tracemalloc.start()
        client.send(frame)
        while not client.poll(10):
            assert time.monotonic() - started < 5
            assert server.recv_requests() == []
        reply = decode_server_message(client.recv())
        assert reply.message == (
            f"message is {len(frame)} bytes; the limit is {1 << 20} bytes (max_message_bytes)"
        )
        assert time.monotonic() - started < 1.0
        # Skipped as it arrives: 2 Mi empty lists would be ~100 MiB, the frame itself 2 MiB.
        assert python_peak_bytes() < 1 << 20
        client.send(generate("after"))  # the connection stays
        assert [r.rid for r in receive(server, 1)] == ["after"]
        client.close()
    finally:
        server.close()


def test_frames_decode_in_bounded_time_and_memory_without_a_schema_less_pass(server, connect):
    client = connect()
    pad = b"\xdd" + (4 << 20).to_bytes(4, "big") + b"\x90" * (4 << 20)
    frames = [
        b"\x91" * 1000 + b"\x00",  # 1,001 bytes of nested arrays
        b"\x82\xa3rid" + b"\x91" * 100_000 + b"\x00\xa4kind\xa8generate",
        b"\x82\xa3pad" + pad + b"\xa4kind\xa8generate",  # 4 Mi empty arrays, skipped
    ]
    started = time.monotonic()
    tracemalloc.start()
    for frame in frames:
        client.send(frame)
    replies = []
    while len(replies) < len(frames):
        assert time.monotonic() - started < 5
        assert server.recv_requests() == []
        if client.poll(10):
            replies.append(decode_server_message(client.recv()))
    assert "Expected `object`, got `array`" in replies[0].message
    assert "nested too deeply" in replies[1].message
    assert "VALID_MESSAGES" not in replies[1].message and "GenerateReqInput" in replies[1].message
    assert "Object contains unknown field `pad`" in replies[2].message
    assert time.monotonic() - started < 1.0
    # The 4 MiB frame is held while it arrives; 4 Mi empty lists would be ~200 MiB.
    assert python_peak_bytes() < 12 << 20
    assert server.malformed_count == 3


def test_waiting_requests_and_tokens_are_limited_per_client_and_in_total(connect):
    server = ZmqServer(
        max_waiting_requests_per_client=2,
        max_waiting_tokens_per_client=10,
        max_waiting_requests=3,
        max_waiting_tokens=12,
    )
    try:
        a, b = (zmq.Context.instance().socket(zmq.DEALER) for _ in range(2))
        for sock in (a, b):
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(server.bound_endpoint)

        def refused(sock, payload) -> str:
            sock.send(payload)
            deadline = time.monotonic() + 5
            while not sock.poll(10):
                assert time.monotonic() < deadline
                assert server.recv_requests() == []
            return read(sock).message

        a.send(generate("a1", [1] * 4))
        a.send(generate("a2", [1] * 4))
        assert [type(r.origin_input_ids) for r in receive(server, 2)] == [array, array]
        assert "max_waiting_requests_per_client=2" in refused(a, generate("a3", [1]))
        # Full, it is refused from its kind and rid alone: the prompt (here invalid, a token
        # id past 2^32) is never decoded.
        bad = msgspec.msgpack.encode({"kind": "generate", "rid": "a4", "input_ids": [2**40]})
        assert "max_waiting_requests_per_client=2" in refused(a, bad)
        assert "max_waiting_tokens_per_client=10" in refused(b, generate("b1", [1] * 11))
        b.send(generate("b1", [1] * 4))
        receive(server, 1)
        assert "max_waiting_requests=3" in refused(b, generate("b2", [1]))
        server.send(output(["a1"], finished=True))  # one leaves: room for one more
        read(a)
        assert "max_waiting_tokens=12" in refused(b, generate("b2", [1] * 5))
        msg = refused(a, encode(ControlReq(type="abort", rid="b1")))
        assert "your live requests" in msg  # control messages are never limited
        b.send(generate("b2", [1] * 4))
        assert [r.rid for r in receive(server, 1)] == ["b2"]
        assert server.waiting_tokens == 12
        a.close()
        b.close()
    finally:
        server.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="assumes glibc's rand()")
def test_a_routing_id_chosen_to_collide_with_the_next_automatic_one_is_harmless():
    # In a fresh process a libzmq ROUTER's first automatic routing id comes from the unseeded
    # rand(), and a peer that took it made libzmq abort when the next anonymous peer connected;
    # the server speaks ZMTP itself and gives peers no ids, and stays up.
    script = """
import ctypes, time, zmq
from schedkit.components.io.zmq_server import ZmqServer
libc = ctypes.CDLL(None)
libc.srand(1)  # rand()'s state at process start, as glibc defines it
low, high = libc.rand(), libc.rand()
libc.srand(1)
guess = b"\\x00" + (low | (high << 31) & 0xFFFFFFFF).to_bytes(4, "big")
server = ZmqServer()
ctx = zmq.Context.instance()
thief = ctx.socket(zmq.DEALER)
thief.setsockopt(zmq.ROUTING_ID, guess)
thief.connect(server.bound_endpoint)
thief.send(b"\\xc1")
plain = ctx.socket(zmq.DEALER)
deadline = time.monotonic() + 5
while not thief.poll(10):
    server.recv_requests()
    assert time.monotonic() < deadline
plain.connect(server.bound_endpoint)
plain.send(b"\\xc1")
while not plain.poll(10):
    server.recv_requests()
    assert time.monotonic() < deadline
print("served", thief.recv()[:9], plain.recv()[:9])
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "served" in result.stdout


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


def test_reads_at_most_max_recv_bytes_per_call_so_a_flood_of_big_frames_cannot_stall_the_loop():
    # Each 100,000-token request fails to decode only at its last id: a whole decode apiece.
    server = ZmqServer(max_recv_bytes_per_call=1 << 20)
    bad = msgspec.msgpack.encode(
        {"kind": "generate", "rid": "x", "input_ids": [70_000] * 99_999 + [2**32]}
    )
    try:
        client = zmq.Context.instance().socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        client.connect(server.bound_endpoint)
        for _ in range(10):
            client.send(bad)
        client.send(generate("last"))
        server.wait(1.0)
        time.sleep(0.5)  # all of it sent: the kernel holds what the server has not read
        assert server.recv_requests() == []
        assert server.malformed_count <= -(-(1 << 20) // len(bad))  # at most the bound read
        assert [r.rid for r in receive(server, 1)] == ["last"]
        assert server.malformed_count == 10
        client.close()
    finally:
        server.close()


def test_after_close_nothing_is_taken_and_replies_go_nowhere(server, connect):
    client = connect()
    client.send(encode(ControlReq(type="get_loads")))
    (control,) = receive(server, 1)
    server.close()
    assert server.recv_requests() == []
    assert server.wait(0.01) is False
    control.reply(None)  # nothing to send on: dropped, no error
    server.send(output(["x"]))


def test_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_recv_bytes_per_call must be an integer >= 1"):
        ZmqServer(max_recv_bytes_per_call=0)
    with pytest.raises(ValueError, match="'recv_seconds_per_call' must be > 0"):
        ZmqServer(recv_seconds_per_call=0)
    with pytest.raises(ValueError, match="inproc:// belongs to libzmq"):
        ZmqServer(endpoint="inproc://zmq-server-test")
    with pytest.raises(
        ValueError, match=r"listens on tcp://HOST:PORT or ipc://PATH, got 'udp://x:5'$"
    ):
        ZmqServer(endpoint="udp://x:5")


def test_refusals_are_logged_at_most_once_a_second(capsys):
    server = ZmqServer()
    client = zmq.Context.instance().socket(zmq.DEALER)
    try:
        client.connect(server.bound_endpoint)
        for _ in range(50):
            client.send(b"\xc1")
        deadline = time.monotonic() + 5
        while server.malformed_count < 50:
            assert time.monotonic() < deadline
            server.wait(0.05)
            server.recv_requests()
        logged = capsys.readouterr()
        assert 1 <= (logged.out + logged.err).count("request refused") <= 5  # not 50
    finally:
        client.close(linger=0)
        server.close()


def test_serves_ipc_clients_too(tmp_path):
    server = ZmqServer(endpoint=f"ipc://{tmp_path}/requests")
    client = zmq.Context.instance().socket(zmq.DEALER)
    try:
        client.setsockopt(zmq.LINGER, 0)
        client.connect(server.bound_endpoint)
        client.send(generate("r"))
        assert [r.rid for r in receive(server, 1)] == ["r"]
        server.send(output(["r"], finished=True))
        assert read(client).rids == ["r"]
    finally:
        client.close()
        server.close()


def test_requests_still_held_at_close_are_refused_to_their_clients(connect):
    server = ZmqServer(release_tokens_per_client=1)
    client = zmq.Context.instance().socket(zmq.DEALER)
    try:
        client.setsockopt(zmq.LINGER, 0)
        client.connect(server.bound_endpoint)
        client.send(generate("first"))
        client.send(generate("second"))
        items = []
        deadline = time.monotonic() + 5
        while server.live_requests < 2:  # "first" goes out; "second" waits for its turn
            assert time.monotonic() < deadline
            server.wait(0.05)
            items += server.recv_requests()
        assert [r.rid for r in items] == ["first"]
        server.close()
        assert read(client) == ErrorReply(
            message="the server shut down before this request was scheduled", rid="second"
        )
    finally:
        client.close()
        server.close()
