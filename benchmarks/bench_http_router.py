"""``sglang-router`` (the package index's Rust router, cache-aware policy) in front of four
schedkit HTTP workers, against schedkit's own event-fed KV router on the same shared-prefix
trace.

Rows, interleaved in each of ``--repeat`` rounds:

- ``sglang-router / serve``: the router over four ``schedkit serve --http`` processes;
- ``sglang-router / fleet``: the router over the four workers of one ``schedkit fleet
  --worker-http auto`` (each worker's own front end);
- ``fleet --http kv``: the same trace over HTTP to ``schedkit fleet --http --router kv``, the
  fleet's KV router served as one endpoint;
- ``fleet kv (in-process)``: ``schedkit fleet --router kv --workload`` (the router drives the
  workers itself, no HTTP).

The trace: ``--requests`` requests in ``--groups`` prefix groups (a shared text prefix of
``--prefix-chars`` characters, then a unique suffix), Poisson arrivals at ``--rate`` per second,
32 new tokens each. Over HTTP the prompts are text (the built-in byte tokenizer makes one token
per byte; the router's cache-aware policy matches text); the fleet gets the same bytes as token
ids in a JSONL trace. Printed for each row: requests completed (over all rounds), prefix-cache
hit rate (cached over prompt tokens), TTFT p50 and p99, and the router's CPU seconds (its
process; the fleet's router process and its HTTP front end for ``fleet --http``), each as
min / median / max over the rounds, and the fewest workers healthy after a round (answering
``/health``; for ``fleet --http``, still routed to per its ``/metrics``).

Usage: ``python benchmarks/bench_http_router.py [--router-python PATH] [--repeat N]``, where
PATH is a Python with ``sglang-router`` installed (``pip install sglang-router``; default: this
one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import select
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from schedkit import wirings
from schedkit.testing.serving import free_endpoint, start_http_serve, stop_serve

NEW_TOKENS = 32


def make_trace(requests: int, groups: int, prefix_chars: int, rate: float, seed: int) -> list[dict]:
    """The shared-prefix trace: text, arrival time (s) and new tokens per request."""
    rng = random.Random(seed)
    letters = string.ascii_lowercase + " "
    prefixes = ["".join(rng.choices(letters, k=prefix_chars)) for _ in range(groups)]
    trace, t = [], 0.0
    for i in range(requests):
        t += rng.expovariate(rate)
        suffix = "".join(rng.choices(letters, k=64))
        trace.append({"text": f"{prefixes[rng.randrange(groups)]}{i} {suffix}", "arrival": t})
    return trace


def model_directory(directory: Path) -> Path:
    """A local model directory holding a ``tokenizer.json``: the workers serve its path as their
    model name, so that the router loads its tokenizer from disk instead of asking a model hub
    for one named like the model (it does at worker registration)."""
    from tokenizers import Tokenizer, models

    model = directory / "schedkit-sim"
    model.mkdir()
    Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(model / "tokenizer.json"))
    return model


async def stream_completion(
    client: httpx.AsyncClient, start: float, item: dict, model: str, max_tokens: int
) -> dict:
    """Send ``item``'s text at ``start + item["arrival"]`` as a streamed completion of
    ``max_tokens`` tokens: ``ok`` (usage received), ``sent`` / ``first`` (first token) /
    ``end`` (perf_counter times) and ``usage``; an HTTP error or status counts as not ok."""
    await asyncio.sleep(max(0.0, start + item["arrival"] - time.perf_counter()))
    sent = time.perf_counter()
    body = {
        "model": model,
        "prompt": item["text"],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    first, usage = None, None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                return {"ok": False, "status": response.status_code}
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and first is None:
                    first = time.perf_counter()
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except httpx.HTTPError as exc:  # counted as not completed
        return {"ok": False, "status": type(exc).__name__}
    end = time.perf_counter()
    return {"ok": usage is not None, "sent": sent, "first": first, "end": end, "usage": usage}


async def drive(url: str, trace: list[dict], model: str) -> list[dict]:
    """Send the trace to ``url`` at its arrival times; one result per request."""
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        start = time.perf_counter()
        return await asyncio.gather(
            *(stream_completion(client, start, item, model, NEW_TOKENS) for item in trace)
        )


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(results: list[dict]) -> dict:
    """Completed requests, hit rate (%), TTFT p50/p99 (ms) of HTTP results."""
    done = [r for r in results if r["ok"]]
    prompt = sum(r["usage"]["prompt_tokens"] for r in done)
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in done)
    ttfts = [(r["first"] - r["sent"]) * 1e3 for r in done if r["first"] is not None]
    return {
        "completed": len(done),
        "hit": 100 * cached / max(prompt, 1),
        "p50": percentile(ttfts, 0.5),
        "p99": percentile(ttfts, 0.99),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_children(pid: int) -> list[int]:
    """The ``schedkit.http`` front-end processes started by process ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"schedkit.http" in command:
            found.append(int(entry.name))
    return found


def wait_healthy(url: str, timeout: float = 60.0) -> None:
    """Wait until ``url``/health answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}/health did not answer 200 within {timeout:g} s")


def start_fleet(workers: int, *args: str, timeout: float = 180.0) -> tuple[subprocess.Popen, dict]:
    """``schedkit fleet`` serving (``args``: ``--http``/``--worker-http`` and others) on the
    shipped wiring; the process and its ready line's endpoints once it serves."""
    command = [sys.executable, "-m", "schedkit.cli", "fleet", str(wirings.path())]
    command += ["--workers", str(workers), "--router", "kv", "--no-worker-cap", *args]
    with tempfile.TemporaryFile() as errors:
        fleet = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
        ready, _, _ = select.select([fleet.stdout], [], [], timeout)
        line = fleet.stdout.readline() if ready else ""
        if not line:
            fleet.kill()
            fleet.wait()
            errors.seek(0)
            raise RuntimeError(f"schedkit fleet did not start: {errors.read()[-2000:]}")
    return fleet, json.loads(line)["ready"]


def route_with_sglang(python: str, trace: list[dict], urls: list[str], model: str, log) -> dict:
    """The trace through sglang-router's cache-aware policy over the workers at ``urls``."""
    port = int(free_endpoint().rsplit(":", 1)[1])
    command = [python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--policy", "cache_aware", "--model-path", model]
    command += ["--tokenizer-path", model, "--worker-urls", *urls]
    router = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        cpu = cpu_seconds(router.pid)
        figures = summary(asyncio.run(drive(url, trace, model)))
        figures["cpu"] = cpu_seconds(router.pid) - cpu
        figures["healthy"] = sum(
            httpx.get(f"{u}/health", timeout=5).status_code == 200 for u in urls
        )
        return figures
    finally:
        router.terminate()
        router.wait(10)


def run_sglang_over_serve(python: str, trace: list[dict], workers: int, directory: Path) -> dict:
    """sglang-router over ``workers`` ``schedkit serve --http`` processes."""
    model = str(directory / "schedkit-sim")
    servers = [start_http_serve("--served-model-name", model) for _ in range(workers)]
    try:
        with (directory / "router.log").open("a") as log:
            return route_with_sglang(python, trace, [u for _, u, _ in servers], model, log)
    finally:
        for server, _, _ in servers:
            stop_serve(server)


def run_sglang_over_fleet(python: str, trace: list[dict], workers: int, directory: Path) -> dict:
    """sglang-router over the workers of ``schedkit fleet --worker-http auto``."""
    model = str(directory / "schedkit-sim")
    fleet, ready = start_fleet(workers, "--worker-http", "auto", "--served-model-name", model)
    try:
        urls = [worker["http"] for worker in ready["workers"]]
        with (directory / "router.log").open("a") as log:
            return route_with_sglang(python, trace, urls, model, log)
    finally:
        stop_serve(fleet, timeout=60)


def run_fleet_http(trace: list[dict], workers: int, directory: Path) -> dict:
    """The trace over HTTP to ``schedkit fleet --http --router kv``."""
    model = str(directory / "schedkit-sim")
    fleet, ready = start_fleet(workers, "--http", "127.0.0.1:0", "--served-model-name", model)
    try:
        url = ready["http"]
        wait_healthy(url)
        pids = [fleet.pid, *http_children(fleet.pid)]
        cpu = sum(map(cpu_seconds, pids))
        figures = summary(asyncio.run(drive(url, trace, model)))
        figures["cpu"] = sum(map(cpu_seconds, pids)) - cpu
        text = httpx.get(f"{url}/metrics", timeout=5).text
        up = [line for line in text.splitlines() if line.startswith("schedkit_fleet_worker_up{")]
        figures["healthy"] = sum(float(line.rsplit(" ", 1)[1]) == 1.0 for line in up)
        return figures
    finally:
        stop_serve(fleet, timeout=60)


def run_fleet(trace: list[dict], workers: int, directory: Path) -> str:
    """The same trace through ``schedkit fleet --router kv`` (live worker processes)."""
    path = directory / "trace.jsonl"
    with path.open("w") as out:
        for i, item in enumerate(trace):
            line = {
                "rid": f"r{i}",
                "input_ids": list(item["text"].encode()),
                "arrival": item["arrival"],
                "max_new_tokens": NEW_TOKENS,
                "ignore_eos": True,
            }
            out.write(json.dumps(line) + "\n")
    overlay = directory / "wall.yaml"
    overlay.write_text("components:\n  model_runner:\n    args:\n      clock: wall\n")
    command = [sys.executable, "-m", "schedkit.cli", "fleet", "-o", str(overlay)]
    command += ["--workers", str(workers), "--router", "kv", "--workload", str(path)]
    command += ["--json", "--no-progress"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"schedkit fleet failed: {result.stderr[-2000:]}")
    data = json.loads(result.stdout.strip().splitlines()[-1])
    fleet = data["fleet"]
    return {
        "completed": fleet["requests_done"],
        "hit": 100 * fleet["prefix_cache_hit_rate"],
        "p50": fleet["ttft_p50_s"] * 1e3,
        "p99": fleet["ttft_p99_s"] * 1e3,
    }


def _spread(values: list[float], digits: int) -> str:
    return " / ".join(
        f"{v:.{digits}f}" for v in (min(values), statistics.median(values), max(values))
    )


def row(name: str, runs: list[dict], requests: int, workers: int) -> str:
    """One table row: completed over every round, then min / median / max of each figure."""
    done = sum(r["completed"] for r in runs)
    cells = [f"{done}/{requests * len(runs)}", _spread([r["hit"] for r in runs], 1)]
    cells += [_spread([r["p50"] for r in runs], 0), _spread([r["p99"] for r in runs], 0)]
    cells.append(_spread([r["cpu"] for r in runs], 2) if "cpu" in runs[0] else "-")
    healthy = [r["healthy"] for r in runs if "healthy" in r]
    cells.append(f"{min(healthy)}/{workers}" if healthy else "-")
    return f"| {name} | " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router-python", default=sys.executable)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=13)
    parser.add_argument("--prefix-chars", type=int, default=1024)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    trace = make_trace(args.requests, args.groups, args.prefix_chars, args.rate, args.seed)
    print(
        f"trace: {args.requests} requests, {args.groups} groups of a {args.prefix_chars}-character "
        f"prefix, {args.rate:g}/s Poisson, {NEW_TOKENS} new tokens; {args.workers} workers; "
        f"{args.repeat} rounds, rows interleaved; figures min / median / max"
    )
    rows = {
        "sglang-router cache_aware / serve --http": lambda d: run_sglang_over_serve(
            args.router_python, trace, args.workers, d
        ),
        "sglang-router cache_aware / fleet --worker-http": lambda d: run_sglang_over_fleet(
            args.router_python, trace, args.workers, d
        ),
        "schedkit fleet --http --router kv": lambda d: run_fleet_http(trace, args.workers, d),
        "schedkit fleet --router kv (no HTTP)": lambda d: run_fleet(trace, args.workers, d),
    }
    runs: dict[str, list[dict]] = {name: [] for name in rows}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        model_directory(directory)
        for round_ in range(args.repeat):
            for name, run in rows.items():
                runs[name].append(run(directory))
                print(f"round {round_ + 1}: {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    print("| router | completed | hit rate % | TTFT p50 ms | TTFT p99 ms | router CPU s | health |")
    print("|---|---|---|---|---|---|---|")
    for name, results in runs.items():
        print(row(name, results, args.requests, args.workers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
