"""``schedkit fleet --http`` and ``--worker-http`` end to end: a real fleet of 2 workers in a child
process, driven by the official ``openai`` client and plain HTTP, stopped with SIGTERM.

One fleet serves the whole module (starting 2 workers and 3 front ends takes a few seconds on a
loaded 2-core machine); the tests run in file order and the last one stops it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from schedkit import wirings
from schedkit.cli import main

KEY = "fleet-test-key"
PAGE = 16  # the default wiring's page size
START_TIMEOUT = 120.0


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(b")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The fleet process, its ready line's endpoints, its stderr file and the processes it
    started."""
    tmp = tmp_path_factory.mktemp("fleet")
    endpoints_file = tmp / "endpoints.json"
    command = [
        *(sys.executable, "-m", "schedkit.cli", "fleet", str(wirings.path())),
        *("--workers", "2", "--router", "kv", "--no-worker-cap"),
        *("--http", "127.0.0.1:0", "--worker-http", "auto", "--api-key", KEY),
        *("--endpoints-file", str(endpoints_file)),
    ]
    env = {k: v for k, v in os.environ.items() if k != "SCHEDKIT_API_KEY"}
    # stderr to a file: nothing has to drain it while the tests run.
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, env=env
        )
        ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT)
        line = process.stdout.readline() if ready else ""
        if not line:
            process.kill()
            process.wait()
            errors.seek(0)
            pytest.fail(f"schedkit fleet --http did not start: {errors.read().decode()[-3000:]}")
        endpoints = json.loads(line)["ready"]
        assert json.loads(endpoints_file.read_text()) == endpoints
        # Every process it started, taken now: a killed worker's children are reparented.
        below = _descendants(process.pid)
        yield process, endpoints, errors, below
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


def _fleet_metrics(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {KEY}"}).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _per_worker(metrics: dict, name: str) -> list[float]:
    return [metrics[(name, (("worker", str(rank)),))] for rank in range(2)]


def test_the_router_routes_by_the_live_kv_index_and_spreads_over_both_workers(fleet):
    _, endpoints, _, _ = fleet
    url = endpoints["http"]
    client = _client(url)
    first = list(range(100, 100 + 8 * PAGE))
    done = client.completions.create(model="schedkit-sim", prompt=first, max_tokens=4)
    assert done.usage.prompt_tokens == len(first) and done.usage.completion_tokens == 4
    deadline = time.monotonic() + 30
    while sum(_per_worker(_fleet_metrics(url), "schedkit_fleet_indexed_blocks")) < 8:
        assert time.monotonic() < deadline, "the router's index never saw the first prompt"
        time.sleep(0.1)
    # The same prefix goes where it is cached; another one to the worker with less cached.
    again = client.completions.create(model="schedkit-sim", prompt=[*first, 7, 8, 9], max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens == 8 * PAGE
    other = list(range(5000, 5000 + 4 * PAGE))
    fresh = client.completions.create(model="schedkit-sim", prompt=other, max_tokens=2)
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    metrics = _fleet_metrics(url)
    assert sorted(_per_worker(metrics, "schedkit_fleet_requests_routed_total")) == [1.0, 2.0]
    done_per_worker = [
        metrics[("schedkit_fleet_requests_ended_total", (("outcome", "done"), ("worker", str(r))))]
        for r in range(2)
    ]
    assert sorted(done_per_worker) == [1.0, 2.0]
    assert sum(_per_worker(metrics, "schedkit_fleet_cached_tokens_total")) == 8 * PAGE


def test_streaming_and_non_streaming_chat_and_completions_with_usage(fleet):
    _, endpoints, _, _ = fleet
    client = _client(endpoints["http"])
    chat = client.chat.completions.create(
        model="schedkit-sim", messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 5
    assert chat.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model="schedkit-sim",
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    stream = client.completions.create(
        model="schedkit-sim",
        prompt="once upon a time",
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces = list(stream)
    assert pieces[-1].usage.completion_tokens == 4
    assert pieces[-1].usage.prompt_tokens == len(b"once upon a time")
    assert "".join(p.choices[0].text for p in pieces if p.choices)


def test_the_same_keys_and_error_bodies_as_serve_http(fleet):
    _, endpoints, _, _ = fleet
    url = endpoints["http"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError) as refused:
        _client(url).completions.create(model="schedkit-sim", prompt="x", max_tokens=2, n=2)
    assert refused.value.body["param"] == "n"
    assert [m.id for m in _client(url).models.list()] == ["schedkit-sim"]
    assert httpx.get(f"{url}/health", headers={"authorization": f"Bearer {KEY}"}).status_code == 200


def test_each_worker_serves_its_own_front_end(fleet):
    _, endpoints, _, _ = fleet
    urls = [worker["http"] for worker in endpoints["workers"]]
    assert len(set(urls)) == 2 and endpoints["http"] not in urls
    for url in urls:
        auth = {"authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{url}/health", headers=auth, timeout=30).status_code == 200
        done = _client(url).completions.create(model="schedkit-sim", prompt=[1, 2, 3], max_tokens=3)
        assert done.usage.completion_tokens == 3
        engine = httpx.get(f"{url}/metrics", headers=auth, timeout=30).text
        assert "sglang:prompt_tokens_total" in engine
    for worker in endpoints["workers"]:
        assert worker["kv_events"].startswith("tcp://127.0.0.1:")


def test_a_killed_worker_is_taken_out_and_the_other_takes_the_requests(fleet):
    _, endpoints, _, _ = fleet
    url = endpoints["http"]
    before = _per_worker(_fleet_metrics(url), "schedkit_fleet_requests_routed_total")
    os.kill(endpoints["workers"][1]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _per_worker(_fleet_metrics(url), "schedkit_fleet_worker_up")[1] != 0.0:
        assert time.monotonic() < deadline, "the killed worker was never taken out"
        time.sleep(0.1)
    client = _client(url)
    for n in range(4):
        done = client.completions.create(model="schedkit-sim", prompt=[n + 1] * 40, max_tokens=2)
        assert done.usage.completion_tokens == 2
    after = _per_worker(_fleet_metrics(url), "schedkit_fleet_requests_routed_total")
    assert (after[0] - before[0], after[1] - before[1]) == (4.0, 0.0)
    assert httpx.get(f"{url}/health", headers={"authorization": f"Bearer {KEY}"}).status_code == 200


def test_sigterm_stops_everything_with_exit_0(fleet):
    process, endpoints, errors, below = fleet
    workers = {worker["pid"] for worker in endpoints["workers"]}
    assert workers <= below and len(below) >= 5  # 2 workers, 3 front ends
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in below) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in below if _alive(pid)] == []
    errors.seek(0)
    assert "schedkit fleet: stopped" in errors.read().decode()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--http", "127.0.0.1:0", "--offline"], "serve live workers; leave out --offline"),
        (["--worker-http", "auto", "--rate", "5", "--json"], "--rate, --json shape a workload"),
        (["--endpoints-file", "e.json"], "--endpoints-file needs --http or --worker-http"),
    ],
)
def test_options_that_do_not_go_with_serving_are_refused(options, message, capsys):
    assert main(["fleet", str(wirings.path()), *options]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nonsense", "70000", "host:"])
def test_a_bad_worker_http_base_is_refused_naming_what_is_valid(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fleet", str(wirings.path()), "--worker-http", value])
    assert exit_info.value.code == 2
    assert "or auto" in capsys.readouterr().err
