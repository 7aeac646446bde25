"""The default wiring assembled and run end to end: real components, real ZeroMQ on loopback."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import schedkit
from schedkit import Req, SamplingParams
from schedkit.components.cache.cache_keys import fill_ids_prefix
from schedkit.kv_events import KvEventSubscriber, KvIndex, page_hashes
from schedkit.testing import cache_page_hashes
from schedkit.testing.serving import free_endpoint, start_serve, stop_serve

ROOT = Path(__file__).resolve().parents[1]
WIRING = ROOT / "wiring.yaml"


def kv_overlay(
    endpoint: str | None = None, replay: str | None = None, profile: str = "sglang", **components
) -> dict:
    config = {
        "publisher": "zmq",
        "endpoint": endpoint or "tcp://127.0.0.1:0",
        "replay_endpoint": replay,
        "topic": "kv-events",
        "profile": profile,
        # Heartbeats take seqs: the tests below count published batches against seqs.
        "heartbeat_interval": 0,
    }
    components.setdefault("kv_events_publisher", {"args": {"kv_events_config": config}})
    # Keep every output message, to check each request's stream.
    components.setdefault("output_sender", {"type": "inproc_output_collector"})
    return {"components": components}


@pytest.fixture
def assemble():
    built = []

    def assemble(*overlays):
        assembly = schedkit.build(schedkit.load_wiring(WIRING, kv_overlay(), *overlays))
        built.append(assembly)
        return assembly

    yield assemble
    for assembly in built:
        assembly.shutdown()


def make_requests(n: int, seed: int = 0, prompt: int = 200, groups: int = 4) -> list[Req]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(10, 32000) for _ in range(prompt // 2)] for _ in range(groups)]
    reqs = []
    for i in range(n):
        tail = [rng.randrange(10, 32000) for _ in range(rng.randint(1, prompt // 2))]
        params = SamplingParams(
            max_new_tokens=rng.randint(1, 60),
            stream=i % 3 != 0,
            stream_interval=rng.choice([None, 1, 4]),
        )
        reqs.append(
            Req(rid=f"r{i}", origin_input_ids=prefixes[i % groups] + tail, sampling_params=params)
        )
    return reqs


def check_finished_once(assembly, reqs: list[Req]) -> None:
    collector = assembly["output_sender"]
    assert collector.double_finishes == []
    for req in reqs:
        assert req.finished_reason is not None, req.rid
        assert len(req.output_ids) == req.sampling_params.max_new_tokens, req.rid
        assert collector.send_counts[req.rid] == 1
        assert collector.outputs[req.rid] == req.output_ids  # streamed pieces concatenate
        assert collector.finished[req.rid] == req.finished_reason


def test_every_request_finishes_exactly_once_with_its_tokens(assemble):
    assembly = assemble()
    scheduler = assembly["scheduler"]
    reqs = make_requests(80)
    for req in reqs:
        scheduler.submit(req)
    scheduler.run_until_idle()
    check_finished_once(assembly, reqs)
    assert sum(r.cached_tokens for r in reqs) > 0
    assert scheduler.finished_count == len(reqs)


def test_under_kv_pressure_requests_are_retracted_and_still_finish_once(assemble):
    assembly = assemble({"components": {"allocator": {"args": {"size": 2048}}}})
    scheduler = assembly["scheduler"]
    reqs = make_requests(60, seed=1, prompt=300)
    for req in reqs:
        req.sampling_params.max_new_tokens = 120
    for req in reqs:
        scheduler.submit(req)
    scheduler.run_until_idle()
    assert scheduler.num_retracted > 0
    check_finished_once(assembly, reqs)


def test_a_lone_long_prompt_has_no_cache_hits_from_its_own_chunks(assemble):
    assembly = assemble()
    scheduler = assembly["scheduler"]
    req = Req(
        rid="long",
        origin_input_ids=[random.Random(5).randrange(10, 32000) for _ in range(20_000)],
        sampling_params=SamplingParams(max_new_tokens=4),
    )
    scheduler.submit(req)
    scheduler.run_until_idle()
    assert len(req.output_ids) == 4
    assert assembly["metrics_reporter"].stats.cache_hit_rate == 0.0
    # The same prompt again is served from the cache: hits now.
    again = Req(rid="again", origin_input_ids=list(req.origin_input_ids))
    again.sampling_params.max_new_tokens = 1
    scheduler.submit(again)
    scheduler.run_until_idle()
    assert assembly["metrics_reporter"].stats.cache_hit_rate > 0.45


def test_priority_policy_from_the_wiring_admits_by_priority(assemble):
    assembly = assemble(
        {
            "components": {
                "policy": {"type": "priority", "args": {"tree_cache": None}},
                "scheduler": {"args": {"max_running_requests": 1}},
            }
        }
    )
    scheduler = assembly["scheduler"]
    order = []
    for rid, priority in [("p0", 0), ("p9", 9), ("pnone", None), ("p5", 5)]:
        req = Req(rid=rid, origin_input_ids=[3, 4, 5], priority=priority)
        req.sampling_params.max_new_tokens = 2
        scheduler.submit(req)
    while scheduler.step():
        order += [r.rid for r in scheduler.running_batch.reqs if r.rid not in order]
    assert order == ["p9", "p5", "p0", "pnone"]


def test_invalid_and_oversized_requests_finish_with_an_error(assemble):
    assembly = assemble({"components": {"allocator": {"args": {"size": 1024}}}})
    scheduler = assembly["scheduler"]
    bad = Req(rid="bad", origin_input_ids=[1, 2], sampling_params=SamplingParams(max_new_tokens=0))
    huge = Req(rid="huge", origin_input_ids=list(range(10, 2000)))
    good = Req(
        rid="good", origin_input_ids=[5] * 40, sampling_params=SamplingParams(max_new_tokens=8)
    )
    out_of_range = Req(rid="ids", origin_input_ids=[1, 2**32])
    for req in (bad, huge, out_of_range, good):
        scheduler.submit(req)
    scheduler.run_until_idle()
    finished = assembly["output_sender"].finished
    assert "max_new_tokens must be an integer >= 1" in finished["bad"].message
    assert "can never fit" in finished["huge"].message
    assert "token ids in [0, 4294967295]" in finished["ids"].message
    assert len(good.output_ids) == 8


@pytest.mark.parametrize("profile", ["sglang", "sglang-array", "vllm"])
def test_kv_index_fed_from_published_events_equals_the_cache(profile):
    endpoint, replay = free_endpoint(), free_endpoint()
    overlays = [
        kv_overlay(endpoint, replay, profile),
        {"components": {"allocator": {"args": {"size": 4096}}}},
    ]
    subscriber = KvEventSubscriber(endpoint, replay, topic="kv-events")
    index = KvIndex()
    with subscriber, schedkit.build(schedkit.load_wiring(WIRING, *overlays)) as assembly:
        scheduler, publisher = assembly["scheduler"], assembly["kv_events_publisher"]
        reqs = make_requests(120, seed=2, prompt=400)
        for req in reqs[::3]:
            req.cache_salt = "tenant-a"  # a namespace of its own, with namespaced hashes
        for req in reqs:
            scheduler.submit(req)
        scheduler.run_until_idle()
        cache = assembly["tree_cache"]
        # Until the subscription is live, published batches pass it by; each round publishes
        # one more (a fresh page), and the first that arrives makes it replay from seq 0.
        deadline = time.monotonic() + 10
        marker = 10
        while subscriber.last_seq is None or subscriber.last_seq < publisher.last_seq:
            assert time.monotonic() < deadline, "events did not arrive"
            cache.insert([marker] * 16)
            marker += 1
            publisher.publish_kv_events()
            assert publisher.flush(5.0)
            for _, batch in subscriber.poll(100):
                index.apply(batch)
        assert assembly["allocator"].available_size() < 4096  # the cache holds pages
        assert index.blocks(0) == cache_page_hashes(cache)
        assert publisher.dropped == 0
        # A router hashes a salted request the way the scheduler published it.
        salted = next(r for r in reversed(reqs) if r.cache_salt)
        key = fill_ids_prefix(salted, -1)
        pages = cache.match_prefix(key).prefix_len // 16
        assert pages > 0
        assert index.match(list(key), 16, cache_salt="tenant-a") == {0: pages}
        assert set(page_hashes(key, 16, cache_salt="tenant-a")[:pages]) <= index.blocks(0)
        assert page_hashes(key, 16)[0] != page_hashes(key, 16, cache_salt="tenant-a")[0]


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_pause_publishes_pending_events_zeroes_the_gauge_and_resumes(assemble, mode):
    assembly = assemble({"components": {"metrics_reporter": {"args": {"decode_log_interval": 5}}}})
    scheduler, reporter = assembly["scheduler"], assembly["metrics_reporter"]
    publisher, cache = assembly["kv_events_publisher"], assembly["tree_cache"]
    reqs = make_requests(20, seed=3)
    for req in reqs:
        req.sampling_params.max_new_tokens = 50
        scheduler.submit(req)
    while reporter.last_gen_throughput == 0.0:
        assert scheduler.step()
    assert publisher.flush(5.0)
    cache.insert([7] * 32)  # pages recorded by the cache, not yet published
    before = publisher.published
    running = list(scheduler.running_batch.reqs)
    assert running

    scheduler.pause_generation(mode)

    assert reporter.last_gen_throughput == 0.0
    assert publisher.flush(5.0)
    assert publisher.published == before + 1
    assert cache.take_events() == []
    if mode == "retract":
        assert scheduler.running_batch.reqs == []
        assert all(r in scheduler.waiting_queue for r in running)
    else:
        assert scheduler.running_batch.reqs == running
    assert not scheduler.step()  # paused: nothing runs
    scheduler.continue_generation()
    scheduler.run_until_idle()
    check_finished_once(assembly, reqs)


def run_cli_together(*commands: tuple[str, ...]) -> list[subprocess.CompletedProcess]:
    """``schedkit`` commands run side by side, each with KV-event endpoints of its own."""
    started = []
    try:
        for args in commands:
            env = {
                **os.environ,
                "SCHEDKIT_KV_EVENTS_ENDPOINT": free_endpoint(),
                "SCHEDKIT_KV_REPLAY_ENDPOINT": free_endpoint(),
            }
            command = [sys.executable, "-m", "schedkit.cli", *args]
            started.append(
                subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        results = []
        for process in started:
            stdout, stderr = process.communicate(timeout=120)
            results.append(
                subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
            )
        return results
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()


def run_cli(
    *args: str, env: dict | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "schedkit.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_schedkit_run_summary_and_lpm_halves_fcfs_median_ttft(tmp_path):
    fcfs = tmp_path / "fcfs.yaml"
    fcfs.write_text("components:\n  policy:\n    type: fcfs\n    args: {tree_cache: null}\n")
    # At 32 conversations/s a queue forms (at the default 16 it mostly does not, and the order
    # of admission matters little).
    busy = ("--rate", "32", "--json")
    # The three runs go side by side (their figures are on the simulated clock), each on
    # KV-event ports of its own.
    table, lpm, fifo = run_cli_together(
        ("run", "wiring.yaml"),
        ("run", "wiring.yaml", *busy),
        ("run", "wiring.yaml", "-o", str(fcfs), *busy),
    )
    assert table.returncode == 0, table.stderr
    assert "Traceback" not in table.stderr
    for label in (
        "requests done / failed",
        "TTFT p50 / p90 / p99",
        "prefix-cache hit rate",
        "KV event batches published / dropped",
        "peak running requests",
    ):
        assert label in table.stdout

    lpm, fifo = json.loads(lpm.stdout), json.loads(fifo.stdout)
    assert lpm["requests_done"] == fifo["requests_done"] == 400
    assert lpm["requests_failed"] == 0
    assert lpm["prefix_cache_hit_rate"] > 0.5 and fifo["prefix_cache_hit_rate"] > 0.5
    # LPM's gain is the median time to first token (2-9x over seeds 0-4 at this rate); its hit
    # rate is ahead on most seeds but not all, so it is not asserted here.
    assert lpm["ttft_p50_s"] * 2 < fifo["ttft_p50_s"]
    assert lpm["kv_event_batches_published"] > 0 and lpm["kv_event_batches_dropped"] == 0


def test_schedkit_run_reports_bad_workload_lines(tmp_path):
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"input_ids": [1, 2]}\n{"prompt_len": -1}\n')
    result = run_cli("run", "wiring.yaml", "--workload", str(workload))
    assert result.returncode == 2
    assert f"{workload}:2: 'prompt_len' must be >= 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_schedkit_serve_takes_requests_and_control_and_stops_cleanly():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from send_requests import Client
    finally:
        sys.path.pop(0)
    server, requests = start_serve(admin_token="admin-secret")
    client = Client(requests)
    try:
        ready = json.loads(server.stdout.readline())
        assert ready["ready"]["requests"] == requests
        for i in range(6):
            client.generate(f"q{i}", [11] * 40 + [i + 12] * 8, max_new_tokens=5 + i)
        results = client.collect({f"q{i}" for i in range(6)}, timeout=30)
        for i in range(6):
            assert len(results[f"q{i}"]["tokens"]) == 5 + i
            assert results[f"q{i}"]["finish"] == {"type": "length", "length": 5 + i}
        loads = client.control("get_loads")
        assert loads.ok and loads.loads["num_running_reqs"] == 0
        refused = client.control("pause", "in_place")
        assert not refused.ok and "needs the admin token" in refused.message
        assert client.control("pause", "in_place", token="admin-secret").ok
        assert client.control("continue", token="admin-secret").ok
        assert client.control("flush", token="admin-secret").ok
        client.generate("late", [3] * 20, max_new_tokens=400)
        time.sleep(0.3)
        server.send_signal(signal.SIGINT)
        # the in-flight request is finished or aborted on shutdown, never dropped
        last = client.collect({"late"}, timeout=30)["late"]
        assert last["finish"]["type"] in ("length", "abort")
        assert server.wait(30) == 0
    finally:
        client.close()
        if server.poll() is None:
            server.kill()
        server.wait()
    assert "Traceback" not in server.stderr.read()


def test_schedkit_serve_refuses_what_the_model_refuses_with_model_limits():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from send_requests import Client
    finally:
        sys.path.pop(0)
    server, requests = start_serve(args=("--model", "llama3-8b", "--model-limits", "refuse"))
    client = Client(requests)
    try:
        assert "ready" in json.loads(server.stdout.readline())
        client.generate("long", [7] * 8186, max_new_tokens=4)  # max_req_input_len: 8,186
        client.generate("oov", [5, 128256, 6], max_new_tokens=4)
        client.generate("fits", [9] * 8180, max_new_tokens=50)  # clipped to 8191 - 8180 - 1
        results = client.collect({"long", "oov", "fits"}, timeout=60)
        assert results["long"]["finish"] == {
            "type": "abort",
            "message": "Input length (8186 tokens) exceeds the maximum allowed length (8186 "
            "tokens). Use a shorter input or enable --allow-auto-truncate.",
        }
        assert results["oov"]["finish"] == {
            "type": "abort",
            "message": "The input_ids contains values greater than the vocab size (128256): "
            "token id 128256 at position 1.",
        }
        assert results["long"]["tokens"] == results["oov"]["tokens"] == []
        assert results["fits"]["finish"] == {"type": "length", "length": 10}
        assert len(results["fits"]["tokens"]) == 10
    finally:
        client.close()
        stop_serve(server)
    assert "Traceback" not in server.stderr.read()
