"""Hostile HTTP clients against a real ``schedkit serve --http`` with small limits: slowloris
headers, a 1 GiB body, 10,000-deep JSON, invalid UTF-8, 5,000 idle connections, a client that
never reads its stream, keys, and a flood from one key while another key's small request is
timed. Each gets a clear status; both processes stay under 300 MiB."""

from __future__ import annotations

import asyncio
import contextlib
import json
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from schedkit.testing.serving import peak_rss_mib, start_http_serve, stop_serve

LIMITS = {
    "header_timeout": 2,
    "body_timeout": 2,
    "send_timeout": 2,
    "max_body_bytes": 1 << 20,
    "max_connections": 1000,
    # The scheduler runs at most this many of the front end's requests at once; the rest of a
    # flood waits in the front end's queue, where admission is fair between keys.
    "max_forwarded_requests": 32,
}
FLOOD = 200
KEYS = {"alice": "alice-key", "bob": "bob-key", "admin": "root-key"}


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


@pytest.fixture(scope="module")
def hostile():
    args = ["--api-key", KEYS["alice"], "--api-key", KEYS["bob"], "--admin-api-key", KEYS["admin"]]
    for name, value in LIMITS.items():
        args += ["--http-limit", f"{name}={value}"]
    server, url, _ = start_http_serve(*args)
    front_end = _children(server.pid)
    yield server, url
    peaks = [peak_rss_mib(server.pid), *(peak_rss_mib(pid) for pid in front_end)]
    assert stop_serve(server) == 0
    assert max(peaks) < 300, peaks


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _auth(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[who]}"}


def _status(raw: socket.socket, timeout: float = 10.0) -> tuple[int, bytes]:
    """The status code and everything read until the server closes."""
    raw.settimeout(timeout)
    data = b""
    while True:
        chunk = raw.recv(65536)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_keys_guard_every_route_and_the_admin_routes(hostile):
    _, url = hostile
    with httpx.Client(base_url=url, timeout=10) as http:
        assert http.get("/health").status_code == 401
        assert http.get("/health", headers={"authorization": "Bearer nope"}).status_code == 401
        assert http.get("/health", headers=_auth("alice")).status_code == 200
        assert http.post("/pause_generation", headers=_auth("bob")).status_code == 403
        assert http.post("/flush_cache", headers=_auth("admin")).status_code == 200
        assert http.post("/continue_generation", headers=_auth("admin")).status_code == 200
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 20000}, "stream": True}
        with http.stream("POST", "/generate", json=body, headers=_auth("bob")) as stream:
            lines = stream.iter_lines()  # kept: dropping it closes the stream
            rid = json.loads(next(lines).removeprefix("data: "))["meta_info"]["id"]
            mine = http.post("/abort_request", json={"rid": rid}, headers=_auth("alice"))
            assert mine.status_code == 403
            by_admin = http.post("/abort_request", json={"rid": rid}, headers=_auth("admin"))
            assert by_admin.status_code == 200, (by_admin.text, mine.text)
            lines = [line for line in lines if line]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2].removeprefix("data: "))["meta_info"]["finish_reason"] == {
            "type": "abort",
            "message": "aborted",
        }


def test_a_rid_chosen_ahead_of_the_servers_own_takes_nobody_elses_request(hostile):
    """A client that chose the rid the server would give next once had another key's request
    refused (already in flight), and its own stream left hanging."""
    _, url = hostile
    with httpx.Client(base_url=url, timeout=30) as http:
        last = http.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=_auth("alice")
        )
        prefix, number = last.json()["id"].removeprefix("cmpl-").rsplit("-", 1)
        squat = {
            "input_ids": [1, 2],
            "rid": f"{prefix}-{int(number) + 1}",
            "sampling_params": {"max_new_tokens": 40},
            "stream": True,
        }
        with http.stream("POST", "/generate", json=squat, headers=_auth("alice")) as stream:
            lines = stream.iter_lines()
            assert json.loads(next(lines).removeprefix("data: "))["meta_info"]["id"] == squat["rid"]
            other = http.post(
                "/v1/completions", json={"prompt": "y", "max_tokens": 2}, headers=_auth("bob")
            )
            assert other.status_code == 200, other.text
            assert other.json()["id"] != f"cmpl-{squat['rid']}"
            lines = [line for line in lines if line]
        assert lines[-1] == "data: [DONE]"
        finish = json.loads(lines[-2].removeprefix("data: "))["meta_info"]["finish_reason"]
        assert finish == {"type": "length", "length": 40}


def test_slowloris_headers_get_408(hostile):
    _, url = hostile
    with socket.create_connection(_address(url)) as raw:
        start = time.monotonic()
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
        raw.settimeout(0.2)
        closed = False
        for i in range(60):  # a header line every 0.1 s, never ending
            try:
                raw.sendall(f"x-slow-{i}: y\r\n".encode())
            except OSError:
                closed = True
                break
            time.sleep(0.1)
        status, _ = _status(raw) if not closed else (408, b"")
        assert status == 408
        assert time.monotonic() - start < 5


def test_a_body_dripped_a_byte_at_a_time_gets_408(hostile):
    _, url = hostile
    body = b'{"prompt": "x", "max_tokens": 2}' + b" " * 100
    with socket.create_connection(_address(url)) as raw:
        start = time.monotonic()
        raw.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer alice-key\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
        )
        with contextlib.suppress(OSError):
            for byte in body:  # 13 s in all, were it let through
                raw.sendall(bytes([byte]))
                time.sleep(0.1)
        status, data = _status(raw)
    assert status == 408 and b"request body not received within 2 s" in data, data[:200]
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("ended", [False, True], ids=["unended", "whole-in-one-read"])
def test_oversized_headers_get_431(hostile, ended):
    _, url = hostile
    with socket.create_connection(_address(url)) as raw:
        head = b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (48 << 10)
        raw.sendall(head + (b"\r\n\r\n" if ended else b""))
        status, data = _status(raw)
    assert status == 431, data[:200]
    assert b"request headers over 16384 bytes" in data


@pytest.mark.parametrize(
    ("request_bytes", "status", "message"),
    [
        (
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n"
            b"transfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
            "not a valid HTTP/1.1 request",
        ),
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", 400, "not a valid HTTP/1.1"),
        (
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer alice-key\r\n"
            b"content-encoding: gzip\r\ncontent-length: 2\r\n\r\n{}",
            415,
            "Content-Encoding 'gzip' is not supported",
        ),
        (  # no WebSocket routes: the upgrade is served as plain HTTP, keys checked
            b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n"
            b"sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
            401,
            "missing or wrong API key",
        ),
        (
            b"DELETE /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer alice-key\r\n"
            b"connection: close\r\n\r\n",
            405,
            "method DELETE not allowed",
        ),
    ],
    ids=["content-length-and-chunked", "tls-hello", "gzip-body", "websocket-upgrade", "method"],
)
def test_malformed_http_gets_a_json_error(hostile, request_bytes, status, message):
    _, url = hostile
    with socket.create_connection(_address(url)) as raw:
        raw.sendall(request_bytes)
        got, data = _status(raw)
    assert got == status, data[:300]
    error = json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]
    assert message in error["message"]
    assert error["type"] != "server_error"  # the client's mistake, not the server's


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "x", "top_k": -5}, "top_k"),
        ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p"),
        ("/v1/completions", {"prompt": "x", "seed": 2**64}, "seed"),
        ("/v1/completions", {"prompt": "x", "logprobs": 0}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2, "min_tokens": 3}, "min_tokens"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user"}], "min_tokens": 10**9},
            "min_tokens",
        ),
        ("/generate", {"text": "x", "sampling_params": {"temperature": -1}}, "temperature"),
        ("/generate", {"text": "x", "sampling_params": {"top_p": 7}}, "top_p"),
        ("/generate", {"text": "x", "sampling_params": {"top_k": 0}}, "top_k"),
        ("/generate", {"text": "x", "sampling_params": {"min_p": -1}}, "min_p"),
        ("/generate", {"text": "x", "sampling_params": {"frequency_penalty": 100}}, "penalty"),
        ("/generate", {"text": "x", "sampling_params": {"repetition_penalty": 0}}, "penalty"),
        (
            "/generate",
            {"text": "x", "sampling_params": {"max_new_tokens": 2, "min_new_tokens": 3}},
            "min_new_tokens",
        ),
        ("/abort_request", {}, "rid"),
    ],
)
def test_values_out_of_range_are_refused_naming_the_field(hostile, path, body, param):
    """What SGLang's and vLLM's own checks refuse is refused, never accepted and ignored."""
    _, url = hostile
    with httpx.Client(base_url=url, timeout=10) as http:
        response = http.post(path, json=body, headers=_auth("alice"))
    assert response.status_code == 400, response.text
    assert param in response.json()["error"]["param"], response.text


def test_a_1_gib_body_is_refused_before_it_is_read(hostile):
    _, url = hostile
    with socket.create_connection(_address(url)) as raw:
        raw.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer alice-key\r\n"
            b"content-type: application/json\r\ncontent-length: 1073741824\r\n\r\n"
        )
        sent = 0
        chunk = b"x" * (1 << 20)
        try:
            while sent < 1 << 30:
                raw.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        status, data = _status(raw)
    assert status == 413
    assert b"max_body_bytes" in data
    assert sent < 256 << 20  # the server closed long before the gibibyte


def test_a_chunked_body_over_the_limit_gets_413(hostile):
    _, url = hostile

    def chunks():
        for _ in range(4):
            yield b"[" * (512 << 10)

    with httpx.Client(base_url=url, timeout=10) as http:
        response = http.post("/v1/completions", content=chunks(), headers=_auth("alice"))
    assert response.status_code == 413


@pytest.mark.parametrize(
    "body",
    [
        b'{"prompt": ' + b"[" * 10000 + b"]" * 10000 + b"}",
        b'{"prompt": "x", "extra": ' + b"[" * 10000 + b"]" * 10000 + b"}",
        b'{"messages": [{"role": "user", "content": "x"}], "tools": ['
        + b"[" * 10000
        + b"]" * 10000
        + b"]}",
        b"[" * 10000,
    ],
    ids=["prompt", "unknown-field", "chat-tools", "unclosed"],
)
def test_10000_deep_json_gets_400(hostile, body):
    _, url = hostile
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    with httpx.Client(base_url=url, timeout=10) as http:
        response = http.post(path, content=body, headers=_auth("alice"))
    assert response.status_code == 400
    assert response.json()["error"]["message"]


def test_invalid_utf8_gets_400(hostile):
    _, url = hostile
    with httpx.Client(base_url=url, timeout=10) as http:
        response = http.post(
            "/v1/completions", content=b'{"prompt": "\xff\xfe\xfd"}', headers=_auth("alice")
        )
    assert response.status_code == 400
    assert "utf-8" in response.json()["error"]["message"].lower()


def test_5000_idle_connections_are_each_answered(hostile):
    _, url = hostile
    address = _address(url)
    sockets = []
    try:
        for _ in range(5000):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(address)
            sockets.append(s)
        deadline = time.monotonic() + 20
        statuses: dict[int, int] = {}
        pending = dict(enumerate(sockets))
        selector = selectors.DefaultSelector()
        for i, s in pending.items():
            selector.register(s, selectors.EVENT_READ, i)
        buffers: dict[int, bytes] = {}
        while pending and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=1):
                i = key.data
                try:
                    chunk = key.fileobj.recv(4096)
                except (BlockingIOError, ConnectionResetError):
                    chunk = b""
                buffers[i] = buffers.get(i, b"") + chunk
                if not chunk or b"\r\n\r\n" in buffers[i]:
                    selector.unregister(key.fileobj)
                    del pending[i]
                    head = buffers[i]
                    statuses[int(head.split(b" ", 2)[1]) if head else 0] = (
                        statuses.get(int(head.split(b" ", 2)[1]) if head else 0, 0) + 1
                    )
                    if head.startswith(b"HTTP/1.1 503"):
                        assert b"retry-after: 1" in head.lower()
        selector.close()
    finally:
        for s in sockets:
            s.close()
    assert not pending
    assert set(statuses) <= {408, 503}, statuses
    assert sum(statuses.values()) == 5000
    # Past max_connections (1,000) answered at once; the others time out on their headers
    # (their slots, freed after 2 s, take later connections in).
    assert statuses.get(503, 0) >= 1000
    assert statuses.get(408, 0) >= 1000
    with httpx.Client(base_url=url, timeout=10) as http:
        assert http.get("/health", headers=_auth("alice")).status_code == 200


def test_a_client_that_never_reads_its_stream_is_cut_off(hostile):
    _, url = hostile
    body = json.dumps(
        {"input_ids": [5] * 4, "sampling_params": {"max_new_tokens": 30000}, "stream": True}
    ).encode()
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(_address(url))
    try:
        raw.sendall(
            b"POST /generate HTTP/1.1\r\nhost: x\r\nauthorization: Bearer alice-key\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        with httpx.Client(base_url=url, timeout=10) as http:
            deadline = time.monotonic() + 60
            seen = False
            while time.monotonic() < deadline:
                load = http.get("/load", headers=_auth("alice")).json()["server_load"]
                seen |= load == 1
                if seen and load == 0:
                    break
                time.sleep(0.1)
            assert seen and load == 0
    finally:
        raw.close()


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:", 1)[1].split()[0]) / 1024


def test_queued_requests_hold_their_encoded_messages_not_their_decoded_bodies(hostile):
    """240 queued prompts of 32,000 token ids: as decoded JSON (a Python int a token) they
    held ~280 MiB in the front end; as the messages they wait to send, ~25 MiB."""
    server, url = hostile
    (front_end,) = _children(server.pid)
    admin = _auth("admin")
    body = json.dumps({"prompt": [[31999] * 32000] * 4, "max_tokens": 1}).encode()
    assert len(body) < LIMITS["max_body_bytes"]

    async def run() -> float:
        limits = httpx.Limits(max_connections=70)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
            before = _rss_mib(front_end)
            assert (await client.post("/pause_generation", headers=admin)).status_code == 200
            try:
                posts = [
                    asyncio.ensure_future(
                        client.post("/v1/completions", content=body, headers=_auth("alice"))
                    )
                    for _ in range(60)
                ]
                deadline = time.monotonic() + 60
                while (await client.get("/get_load", headers=admin)).json()[0][
                    "num_waiting_reqs"
                ] < 240:
                    assert time.monotonic() < deadline, "the requests were never all queued"
                    await asyncio.sleep(0.1)
                grown = _rss_mib(front_end) - before
                aborted = await client.post(
                    "/abort_request", json={"abort_all": True}, headers=admin
                )
                assert aborted.status_code == 200
            finally:
                assert (await client.post("/continue_generation", headers=admin)).status_code == 200
            answers = await asyncio.gather(*posts)
            assert {a.status_code for a in answers} == {400}, answers[0].text  # aborted
            while (await client.get("/load", headers=admin)).json()["server_load"]:
                await asyncio.sleep(0.05)
            return grown

    grown = asyncio.run(run())
    assert grown < 100, f"the front end grew {grown:.0f} MiB"


def test_a_flood_from_one_key_cannot_hold_back_another_keys_small_request(hostile):
    """With generation paused, one key queues a flood past the scheduler's window, then another
    key one small request: once generation continues, the small request takes the next freed
    slot instead of waiting behind the flood (latency figures: benchmarks/bench_http_flood.py)."""
    _, url = hostile
    admin = _auth("admin")

    async def post(client: httpx.AsyncClient, who: str, body: dict) -> float:
        response = await client.post("/v1/completions", json=body, headers=_auth(who))
        assert response.status_code == 200, response.text
        return time.perf_counter()

    async def queued(client: httpx.AsyncClient) -> int:
        load = (await client.get("/get_load", headers=admin)).json()[0]
        return load["num_waiting_reqs"]

    async def run() -> tuple[list[float], float]:
        limits = httpx.Limits(max_connections=FLOOD + 10)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
            assert (await client.post("/pause_generation", headers=admin)).status_code == 200
            try:
                flood = [
                    asyncio.ensure_future(
                        post(client, "alice", {"prompt": f"flood {i}", "max_tokens": 16})
                    )
                    for i in range(FLOOD)
                ]
                while await queued(client) < FLOOD:
                    await asyncio.sleep(0.05)
                small = asyncio.ensure_future(post(client, "bob", {"prompt": "s", "max_tokens": 4}))
                while await queued(client) < FLOOD + 1:
                    await asyncio.sleep(0.05)
            finally:
                assert (await client.post("/continue_generation", headers=admin)).status_code == 200
            return await asyncio.gather(*flood), await small

    flood_done, small_done = asyncio.run(run())
    # Behind the flood it would finish last; fair, it finishes with the first windowful.
    finished_before = sum(t < small_done for t in flood_done)
    assert finished_before <= 2 * LIMITS["max_forwarded_requests"], finished_before


_ORPHAN_SCRIPT = """
import json, subprocess, sys
config = json.dumps({"port": 0, "scheduler_endpoint": sys.argv[1]}).encode()
child = subprocess.Popen([sys.executable, "-m", "schedkit.http"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
child.stdin.write(config)
child.stdin.close()
print(child.pid, child.stdout.readline().decode().strip(), flush=True)
child.wait()
"""


def test_a_front_end_without_its_scheduler_says_so_in_one_line(tmp_path):
    endpoint = f"ipc://{tmp_path}/nothing-listens"
    result = subprocess.run(
        [sys.executable, "-m", "schedkit.http"],
        input=json.dumps({"port": 0, "scheduler_endpoint": endpoint}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"schedkit http: cannot connect to the scheduler at {endpoint}")
    assert "Traceback" not in result.stderr


def test_a_front_end_whose_parent_is_killed_stops_serving(tmp_path):
    """A scheduler killed outright (no chance to stop its front end) once left the front end
    holding its port for ever."""
    listener = socket.socket(socket.AF_UNIX)  # stands in for the scheduler's edge
    listener.bind(str(tmp_path / "edge"))
    listener.listen()
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, f"ipc://{tmp_path}/edge"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pid, ready = parent.stdout.readline().split(" ", 1)
        url = json.loads(ready)["http"]
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and b"zombie" not in _state(int(pid)):
            assert time.monotonic() < deadline, "the orphaned front end is still running"
            time.sleep(0.1)
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/ping", timeout=5)
    finally:
        listener.close()
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/status").read_bytes()
    except FileNotFoundError:
        return b"zombie"
