"""A scripted hostile session against a real ``schedkit serve``: garbage, out-of-range token
ids, huge lists, duplicate rids, a client that disconnects mid-stream and a bystander, while
two well-behaved clients each get exactly their own outputs, every request finishing once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import msgspec
import zmq

from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    ErrorReply,
    GenerateReqInput,
    SamplingParamsInput,
    decode_server_message,
    encode,
)
from schedkit.testing.serving import peak_rss_mib, start_serve


class Client:
    def __init__(self, endpoint: str, **options: object) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        for name, value in options.items():
            self.sock.setsockopt(getattr(zmq, name), value)
        self.sock.connect(endpoint)
        self.tokens: dict[str, list[int]] = {}
        self.finishes: dict[str, int] = {}
        self.errors: list[ErrorReply] = []
        self.replies: list[ControlReply] = []

    def generate(self, rid: str, ids: list[int], n: int) -> None:
        params = SamplingParamsInput(max_new_tokens=n, stream=True)
        self.sock.send(encode(GenerateReqInput(rid=rid, input_ids=ids, sampling_params=params)))

    def pump(self, timeout_ms: int = 20) -> None:
        while self.sock.poll(timeout_ms):
            timeout_ms = 0
            msg = decode_server_message(self.sock.recv())
            if isinstance(msg, ErrorReply):
                self.errors.append(msg)
            elif isinstance(msg, ControlReply):
                self.replies.append(msg)
            elif isinstance(msg, BatchTokenIDOutput):
                for i, rid in enumerate(msg.rids):
                    self.tokens.setdefault(rid, []).extend(msg.output_ids[i])
                    if msg.finished_reasons[i] is not None:
                        self.finishes[rid] = self.finishes.get(rid, 0) + 1

    def control(self, kind: str) -> ControlReply:
        self.sock.send(encode(ControlReq(type=kind)))
        deadline = time.monotonic() + 10
        while not self.replies:
            assert time.monotonic() < deadline, f"no reply to {kind}"
            self.pump()
        return self.replies.pop(0)


def shut_down(server: subprocess.Popen, clients: list[Client]) -> str:
    """Close the clients and the server (killed if still running); the server's stderr."""
    for c in clients:
        c.sock.close()
    if server.poll() is None:
        server.kill()
    server.wait()
    return server.stderr.read()


def wait_for(clients: list[Client], done, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, (
            f"timed out {[(len(c.finishes), len(c.errors)) for c in clients]}"
        )
        for c in clients:
            c.pump(5)


def test_serve_survives_a_hostile_session_and_routes_every_output_to_its_owner():
    server, endpoint = start_serve()
    alice, bob, hostile, bystander, leaver = (Client(endpoint) for _ in range(5))
    clients = [alice, bob, hostile, bystander, leaver]
    try:
        assert json.loads(server.stdout.readline())["ready"]["requests"] == endpoint
        # The leaver starts a long generation and disconnects mid-stream.
        leaver.generate("leaver-1", [9] * 30, 3000)
        wait_for([leaver], lambda: leaver.tokens.get("leaver-1"))
        leaver.sock.close()
        for i in range(4):
            alice.generate(f"a{i}", [5] * 50 + [i] * 10, 20 + i)
            bob.generate(f"b{i}", [5] * 50 + [100 + i] * 10, 10 + i)
        hostile.sock.send(b"\xc1\xc1 not msgpack")
        hostile.generate("h-big", [1, 2, 2**32], 4)
        hostile.sock.send_multipart([b"two", b"frames"])
        huge_stop = SamplingParamsInput(max_new_tokens=4, stop_token_ids=list(range(1_000_000)))
        for i in range(20):
            hostile.sock.send(
                encode(GenerateReqInput(rid=f"h-stop{i}", input_ids=[1], sampling_params=huge_stop))
            )
        hostile.generate("h-dup", [3] * 20, 200)
        hostile.generate("h-dup", [3] * 20, 200)
        hostile.sock.send(encode(ControlReq(type="abort", rid="a0")))  # not its request
        hostile.sock.send(msgspec.msgpack.encode({"kind": "control", "y" * (1 << 20): 1}))
        framer = Client(endpoint)  # a message of 10,000 frames costs it its connection
        clients.append(framer)
        framer.sock.send_multipart([b"f"] * 10_000)
        req = zmq.Context.instance().socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(endpoint)
        req.send(encode(ControlReq(type="get_loads")))
        wait_for(
            clients[:3],
            lambda: (
                len(alice.finishes) == 4 and len(bob.finishes) == 4 and len(hostile.errors) >= 26
            ),
        )
        assert req.poll(5000), "a REQ socket got no answer"
        assert "connect a DEALER" in decode_server_message(req.recv()).message
        req.close()
        wait_for([hostile], lambda: hostile.finishes.get("h-dup"))

        assert alice.finishes == {f"a{i}": 1 for i in range(4)}
        assert bob.finishes == {f"b{i}": 1 for i in range(4)}
        assert {rid: len(t) for rid, t in alice.tokens.items()} == {
            f"a{i}": 20 + i for i in range(4)
        }
        assert {rid: len(t) for rid, t in bob.tokens.items()} == {f"b{i}": 10 + i for i in range(4)}
        bystander.pump(200)
        assert bystander.tokens == {} and bystander.errors == []
        messages = [e.message for e in hostile.errors]
        assert any(m.startswith("MessagePack data is malformed") for m in messages)
        assert any("$.input_ids[2]" in m for m in messages)
        assert any("expected one message frame" in m for m in messages)
        assert sum("$.sampling_params.stop_token_ids" in m for m in messages) == 20
        assert any(m == "rid 'h-dup' is already in flight" for m in messages)
        assert any("your live requests" in m for m in messages)
        assert any("unknown field `yyy" in m and len(m) <= 1000 for m in messages)
        assert hostile.finishes == {"h-dup": 1}
        # The leaver's generation was aborted when its connection closed.
        loads = alice.control("get_loads")
        assert loads.ok and loads.loads["num_running_reqs"] == 0
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        stderr = shut_down(server, clients)
    assert "Traceback" not in stderr
    assert "client dropped" in stderr
    assert "a message of more than 64 frames" in stderr


def test_messages_decode_with_plain_msgpack_too():
    payload = encode(ErrorReply(message="x", rid="r"))
    assert msgspec.msgpack.decode(payload) == {"kind": "error", "message": "x", "rid": "r"}


def first_automatic_routing_ids(routers: int, per_router: int) -> list[bytes]:
    """The routing ids libzmq gives the first anonymous peers of the first ``routers`` ROUTER
    sockets of a process whose rand() nothing seeded (b"\\x00" + a counter that starts from
    two rand() calls)."""
    script = "import ctypes; r = ctypes.CDLL(None).rand; print([r() for _ in range(64)])"
    values = json.loads(
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        ).stdout
    )
    ids = []
    for low, high in zip(values[0 : 2 * routers : 2], values[1 : 2 * routers : 2], strict=True):
        start = low | (high << 31) & 0xFFFFFFFF
        ids += [b"\x00" + ((start + i) & 0xFFFFFFFF).to_bytes(4, "big") for i in range(per_router)]
    return ids


def test_serve_survives_hostile_frames_ids_and_floods_and_stays_under_300_mib():
    server, endpoint = start_serve()
    clients: list[Client] = []

    def client(**options: object) -> Client:
        clients.append(Client(endpoint, **options))
        return clients[-1]

    try:
        assert json.loads(server.stdout.readline())["ready"]["requests"] == endpoint
        # Peers that take the automatic ids libzmq would hand out next, were rand() unseeded,
        # connect first; then anonymous peers connect (the last thing an unpatched serve does).
        squatters = [client(ROUTING_ID=rid) for rid in first_automatic_routing_ids(3, 4)]
        for s in squatters:
            s.sock.send(b"\xc1")
        wait_for(squatters, lambda: all(s.errors for s in squatters), timeout=15)

        hostile = client()
        hostile.sock.send(b"\x91" * 1000 + b"\x00")  # 1,001 bytes of nested arrays
        n = (32 << 20) - 5
        hostile.sock.send(b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n)  # 32 MiB of []
        wait_for([hostile], lambda: len(hostile.errors) == 2)
        assert "Expected `object`, got `array`" in hostile.errors[0].message
        assert "the limit is 8388608 bytes (max_message_bytes)" in hostile.errors[1].message

        # A client leaves with 20 long generations under way; a newcomer takes its routing id.
        alice = client(ROUTING_ID=b"alice")
        for i in range(20):
            alice.generate(f"alice-{i}", [7] * 64 + [i], 5000)
        wait_for([alice], lambda: len(alice.tokens) == 20)
        alice.sock.close()
        deadline = time.monotonic() + 10
        while True:  # a newcomer under alice's routing id is a new client: retry until in
            assert time.monotonic() < deadline, "the thief never got in"
            thief = client(ROUTING_ID=b"alice")
            thief.sock.send(encode(ControlReq(type="get_loads")))
            thief.pump(200)
            if thief.replies:
                break
            thief.sock.close()
        thief.pump(300)
        assert thief.tokens == {} and thief.errors == []

        # One client floods 1,000 requests of 32k tokens, reading its refusals, then leaves.
        flood = client()
        prompt = [1000 + (j * 7919) % 60000 for j in range(32 << 10)]
        for i in range(1000):
            flood.sock.send(encode(GenerateReqInput(rid=f"f{i}", input_ids=prompt)))
            flood.pump(0)
        wait_for([flood], lambda: len(flood.errors) >= 1000 - 32, timeout=60)
        assert all("max_waiting_tokens_per_client=1048576" in e.message for e in flood.errors)
        flood.sock.close()

        bob = client()
        for i in range(4):
            bob.generate(f"b{i}", [5] * 50 + [100 + i] * 10, 10 + i)
        wait_for([bob], lambda: len(bob.finishes) == 4)
        assert {rid: len(t) for rid, t in bob.tokens.items()} == {f"b{i}": 10 + i for i in range(4)}
        assert bob.errors == []
        deadline = time.monotonic() + 10
        while True:  # the flood's requests go once the server sees its connection closed
            loads = bob.control("get_loads").loads
            if (loads["num_running_reqs"], loads["num_waiting_reqs"]) == (0, 0):
                break
            assert time.monotonic() < deadline, loads
            time.sleep(0.05)
        assert loads["num_used_tokens"] == 0  # the departed clients' KV was freed
        thief.pump(50)
        assert thief.tokens == {}
        peak = peak_rss_mib(server.pid)
        assert peak < 300, f"serve peaked at {peak:.0f} MiB"
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        stderr = shut_down(server, clients)
    assert "Traceback" not in stderr and "Assertion failed" not in stderr
    assert "client dropped" in stderr
