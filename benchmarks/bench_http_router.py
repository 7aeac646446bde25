"""``sglang-router`` (the package index's Rust router, cache-aware policy) in front of four
``schedkit serve --http`` workers, against schedkit's own event-fed KV router (``schedkit fleet
--router kv``) on the same shared-prefix trace.

The trace: ``--requests`` requests in ``--groups`` prefix groups (a shared text prefix of
``--prefix-chars`` characters, then a unique suffix), Poisson arrivals at ``--rate`` per second,
32 new tokens each. Over HTTP the prompts are text (the built-in byte tokenizer makes one token
per byte; the router's cache-aware policy matches text); the fleet gets the same bytes as token
ids in a JSONL trace. Printed for each: requests completed, prefix-cache hit rate (cached over
prompt tokens) and TTFT p50 / p99.

Usage: ``python benchmarks/bench_http_router.py [--router-python PATH]``, where PATH is a Python
with ``sglang-router`` installed (``pip install sglang-router``; default: this one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

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


async def _one(client: httpx.AsyncClient, start: float, item: dict, model: str) -> dict:
    await asyncio.sleep(max(0.0, start + item["arrival"] - time.perf_counter()))
    sent = time.perf_counter()
    body = {
        "model": model,
        "prompt": item["text"],
        "max_tokens": NEW_TOKENS,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    first, usage = None, None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return {"ok": False, "status": response.status_code}
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and first is None:
                first = time.perf_counter() - sent
            if chunk.get("usage"):
                usage = chunk["usage"]
    return {"ok": usage is not None, "ttft": first, "usage": usage}


async def drive(url: str, trace: list[dict], model: str) -> list[dict]:
    """Send the trace to ``url`` at its arrival times; one result per request."""
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        start = time.perf_counter()
        return await asyncio.gather(*(_one(client, start, item, model) for item in trace))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(results: list[dict]) -> str:
    """completed, hit rate, TTFT p50/p99 of HTTP results."""
    done = [r for r in results if r["ok"]]
    prompt = sum(r["usage"]["prompt_tokens"] for r in done)
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in done)
    ttfts = [r["ttft"] * 1e3 for r in done if r["ttft"] is not None]
    return (
        f"{len(done)}/{len(results)} completed | {100 * cached / max(prompt, 1):.1f}% | "
        f"{_pct(ttfts, 0.5):.0f} | {_pct(ttfts, 0.99):.0f}"
    )


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


def run_sglang_router(python: str, trace: list[dict], workers: int, directory: Path) -> str:
    """The trace through sglang-router's cache-aware policy over ``workers`` HTTP workers."""
    model = str(model_directory(directory))
    servers = [start_http_serve("--served-model-name", model) for _ in range(workers)]
    router = None
    log = (directory / "router.log").open("w")
    try:
        port = int(free_endpoint().rsplit(":", 1)[1])
        command = [python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--policy", "cache_aware", "--model-path", model]
        command += ["--tokenizer-path", model, "--worker-urls", *(url for _, url, _ in servers)]
        router = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        results = asyncio.run(drive(url, trace, model))
        healthy = sum(httpx.get(f"{u}/health", timeout=5).status_code == 200 for _, u, _ in servers)
        return f"{summary(results)} | {healthy}/{workers} workers healthy"
    finally:
        if router is not None:
            router.terminate()
            router.wait(10)
        for server, _, _ in servers:
            stop_serve(server)
        log.close()


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
    return (
        f"{fleet['requests_done']}/{len(trace)} completed | "
        f"{100 * fleet['prefix_cache_hit_rate']:.1f}% | {fleet['ttft_p50'] * 1e3:.0f} | "
        f"{fleet['ttft_p99'] * 1e3:.0f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router-python", default=sys.executable)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=13)
    parser.add_argument("--prefix-chars", type=int, default=1024)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    trace = make_trace(args.requests, args.groups, args.prefix_chars, args.rate, args.seed)
    print(
        f"trace: {args.requests} requests, {args.groups} groups of a {args.prefix_chars}-character "
        f"prefix, {args.rate:g}/s Poisson, {NEW_TOKENS} new tokens; {args.workers} workers"
    )
    print("| router | completed | hit rate | TTFT p50 ms | TTFT p99 ms | health |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        routed = run_sglang_router(args.router_python, trace, args.workers, Path(tmp))
        print(f"| sglang-router cache_aware | {routed} |")
        print(f"| schedkit fleet kv | {run_fleet(trace, args.workers, Path(tmp))} | - |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
