"""SGLang's native routes and vLLM's ``/load`` and ``/ping`` on a real ``schedkit serve --http``,
with the field names those engines send."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest


@pytest.fixture
def http(http_server):
    _, url = http_server
    with httpx.Client(base_url=url, timeout=30) as client:
        yield client


def test_generate_text_and_input_ids(http):
    done = http.post("/generate", json={"text": "abc", "sampling_params": {"max_new_tokens": 5}})
    assert done.status_code == 200
    body = done.json()
    assert len(body["output_ids"]) == 5
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert body["meta_info"]["prompt_tokens"] == 3
    assert body["meta_info"]["completion_tokens"] == 5
    assert {"id", "cached_tokens", "e2e_latency"} <= body["meta_info"].keys()
    by_ids = http.post("/generate", json={"input_ids": [1, 2, 3, 4], "rid": "mine-1"})
    assert by_ids.json()["meta_info"]["id"] == "mine-1"
    assert len(by_ids.json()["output_ids"]) == 128  # SGLang's default max_new_tokens


def test_generate_stream_sends_text_so_far_and_done(http):
    body = {"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 6}, "stream": True}
    with http.stream("POST", "/generate", json=body) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert len(chunks) >= 2
    assert [len(c["output_ids"]) for c in chunks] == sorted(len(c["output_ids"]) for c in chunks)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert len(chunks[-1]["output_ids"]) == 6
    assert chunks[-1]["text"].startswith(chunks[0]["text"])


def test_generate_refusals_name_the_field(http):
    both = http.post("/generate", json={"text": "a", "input_ids": [1]})
    assert both.status_code == 400
    logprob = http.post("/generate", json={"text": "a", "return_logprob": True})
    assert logprob.status_code == 400
    assert logprob.json()["error"]["param"] == "return_logprob"


def test_health_info_and_load(http):
    assert http.get("/health").status_code == 200
    assert http.get("/health_generate").status_code == 200
    assert http.get("/ping").status_code == 200
    info = http.get("/get_model_info").json()
    assert info["model_path"] == "schedkit-sim"
    assert info["is_generation"] is True
    server = http.get("/get_server_info").json()
    assert server["internal_states"][0]["num_running_reqs"] == 0
    assert "api_key" not in server
    load = http.get("/get_load").json()
    assert set(load[0]) == {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
    assert http.get("/load").json() == {"server_load": 0}


def test_metrics_on_the_same_port(http):
    http.post("/generate", json={"text": "metrics", "sampling_params": {"max_new_tokens": 2}})
    text = http.get("/metrics").text
    assert "sglang:num_running_reqs" in text
    assert "sglang:prompt_tokens_total" in text
    assert 'model_name="schedkit-sim"' in text


def test_pause_continue_and_flush(http):
    paused = http.post("/pause_generation", json={"mode": "in_place"})
    assert paused.json() == {"message": "Generation paused successfully.", "status": "ok"}
    try:
        with (
            httpx.Client(base_url=str(http.base_url), timeout=1.0) as other,
            pytest.raises(httpx.ReadTimeout),
        ):
            other.post(
                "/generate", json={"text": "waits", "sampling_params": {"max_new_tokens": 1}}
            )
    finally:
        resumed = http.post("/continue_generation")
    assert resumed.json()["status"] == "ok"
    deadline = time.monotonic() + 10
    while http.get("/load").json()["server_load"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert http.post("/flush_cache").status_code == 200


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_a_client_that_leaves_mid_request_has_its_request_aborted(http_server, http, stream):
    _, url = http_server
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {"input_ids": [3] * 8, "sampling_params": {"max_new_tokens": 30000}, "stream": stream}
    ).encode()
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(
            b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        if stream:
            received = b""
            while b"data: " not in received:
                received += raw.recv(65536)
        else:
            deadline = time.monotonic() + 10
            while http.get("/load").json()["server_load"] == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
        assert http.get("/load").json()["server_load"] == 1
    deadline = time.monotonic() + 30
    loads: dict = {}
    while time.monotonic() < deadline:
        info = http.get("/get_server_info")
        if info.status_code == 503:  # the scheduler did not answer its load query in time
            continue
        loads = info.json()["internal_states"][0]
        if http.get("/load").json()["server_load"] == 0 and loads["num_running_reqs"] == 0:
            break
        time.sleep(0.05)
    assert http.get("/load").json()["server_load"] == 0
    assert loads.get("num_running_reqs") == 0, loads


def test_unknown_route_and_method(http):
    missing = http.get("/v2/nothing")
    assert missing.status_code == 404
    assert "no such route" in missing.json()["error"]["message"]
    assert http.get("/v1/completions").status_code == 405


def test_pipelined_requests_and_connection_close_on_one_raw_connection(http_server):
    """Whole responses written in one piece keep the connection's bookkeeping: pipelined
    requests are answered in order, and ``connection: close`` is honoured."""
    _, url = http_server
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}}).encode()
    head = f"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n"
    keep, close = (head + "\r\n").encode() + body, (head + "connection: close\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        raw.sendall(keep + keep + close + body)
        data = b""
        while chunk := raw.recv(65536):  # until the server closes
            data += chunk
    responses = []
    while data:
        head_end = data.index(b"\r\n\r\n") + 4
        headers = data[:head_end].lower()
        length = int(headers.split(b"content-length: ")[1].split(b"\r\n")[0])
        responses.append((headers, json.loads(data[head_end : head_end + length])))
        data = data[head_end + length :]
    assert [h.split(b"\r\n")[0] for h, _ in responses] == [b"http/1.1 200 ok"] * 3
    assert [len(r["output_ids"]) for _, r in responses] == [3, 3, 3]
    assert [b"connection: close" in h for h, _ in responses] == [False, False, True]
