"""The package index's ``sglang-router`` (the SGLang model gateway, a Rust binary) against
schedkit's own ``sglang`` policy, each beside its own round robin, in front of the same 8
schedkit workers (llama3-8b on the h100 preset, wall clock) on a Mooncake-shaped or an
Azure-shaped trace.

Rows, interleaved in each of ``--repeat`` rounds, each on a fresh ``schedkit fleet``
(``--worker-http auto``: every worker has its own HTTP front end):

- ``sglang-router cache_aware``: ``python -m sglang_router.launch_router --policy
  cache_aware`` (its defaults: 0.3 / 64 / 1.5) over the workers' front ends;
- ``sglang-router round_robin``: the same binary with ``--policy round_robin``;
- ``schedkit sglang`` / ``schedkit round_robin``: the fleet's own router (``fleet --http
  --router ...``) over the same workers, served as one endpoint.

Every row sees the same HTTP client, the same text and the same workers. Prompts are text:
the workers' byte tokenizer makes one token per byte and the gateway matches text, so each
trace block (``--block`` tokens of a Mooncake-shaped trace's hash id) becomes ``--block``
letters drawn from a generator seeded by the block's id, and an Azure-shaped prompt is its
length of fresh letters (nothing shared). Front-end admission is opened up (``--http-limit``,
see ``OPEN_LIMITS``) so that requests queue in the schedulers as in the in-process fleet.
With ``--speedup X`` the trace and the model run X times faster and latencies are printed
multiplied back by X (as bench_fleet's live rows).

Printed per row, min / median / max over the rounds: requests completed, prefix-cache hit
rate (cached over prompt tokens, from each response's usage), TTFT p50 and p99 (ms, client
side, from the request's send to its first streamed token), output tokens per second (over
the first send to the last finish) and the load imbalance (most requests one worker took,
from its ``/metrics``, over the mean). A request that fails (an HTTP error, a broken stream)
is counted as not completed. Needs ``tokenizers`` here (the router loads the workers' model
directory's ``tokenizer.json``).

Usage: ``python benchmarks/sglang_router_real.py --router-python PATH [--trace
mooncake|azure] [--requests N] [--rate R] [--repeat N]``, PATH a Python with ``sglang-router``
installed (``pip install sglang-router``).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import random
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from schedkit.testing.serving import free_endpoint, stop_serve
from schedkit.workloads.shaped import write_azure_shaped, write_mooncake_shaped

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_http_router import (
    model_directory,
    percentile,
    start_fleet,
    stream_completion,
    wait_healthy,
)

LETTERS = string.ascii_lowercase + " "
OPEN_LIMITS = {
    "max_forwarded_requests": 100_000,
    "max_forwarded_tokens": 1 << 30,
    "max_forwarded_per_key": 100_000,
    "max_key_lead": 100_000,
    "max_key_lead_tokens": 1 << 30,
    "max_scheduler_waiting": 100_000,
    "max_scheduler_waiting_tokens": 1 << 30,
    "max_queued_per_key": 100_000,
    "max_queued": 100_000,
    "max_body_bytes": 64 << 20,
}
CONTEXT = 140_000


def mooncake_texts(requests: int, rate: float, seed: int, block: int, tmp: Path) -> list[dict]:
    """The Mooncake-shaped trace as text: each hash id's block is the same letters."""
    path = write_mooncake_shaped(tmp / "mooncake.jsonl", requests, seed=seed, rate=rate)
    blocks: dict[int, str] = {}
    trace = []
    for line in path.read_text().splitlines():
        item = json.loads(line)
        parts = []
        for h in item["hash_ids"]:
            if h not in blocks:
                rng = random.Random(f"{seed}:{h}")
                blocks[h] = "".join(rng.choices(LETTERS, k=block))
            parts.append(blocks[h])
        text = "".join(parts)[: item["input_length"]]
        trace.append(
            {"text": text, "arrival": item["timestamp"] / 1e3, "out": item["output_length"]}
        )
    return trace


def azure_texts(requests: int, rate: float, seed: int, tmp: Path) -> list[dict]:
    """The Azure-shaped trace as text: every prompt its own letters (nothing shared)."""
    path = write_azure_shaped(tmp / "azure.csv", requests, seed=seed, rate=rate)
    rng = random.Random(seed)
    rows = list(csv.DictReader(path.open()))
    stamps = [time.mktime(time.strptime(r["TIMESTAMP"][:19], "%Y-%m-%d %H:%M:%S")) for r in rows]
    fractions = [float("0." + r["TIMESTAMP"][20:]) for r in rows]
    start = stamps[0] + fractions[0]
    return [
        {
            "text": "".join(rng.choices(LETTERS, k=int(r["ContextTokens"]))),
            "arrival": s + f - start,
            "out": int(r["GeneratedTokens"]),
        }
        for r, s, f in zip(rows, stamps, fractions, strict=True)
    ]


async def drive(url: str, trace: list[dict], model: str, speedup: float) -> list[dict]:
    """Send the trace to ``url`` at its arrival times (divided by ``speedup``)."""
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=500)
    items = [{**item, "arrival": item["arrival"] / speedup} for item in trace]
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as client:
        start = time.perf_counter()
        return await asyncio.gather(
            *(stream_completion(client, start, item, model, item["out"]) for item in items)
        )


def requests_per_worker(urls: list[str]) -> list[float]:
    """Each worker's ``sglang:num_requests_total`` from its ``/metrics``."""
    counts = []
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        lines = [ln for ln in text.splitlines() if ln.startswith("sglang:num_requests_total")]
        counts.append(sum(float(ln.rsplit(" ", 1)[1]) for ln in lines))
    return counts


def figures(results: list[dict], speedup: float, counts: list[float]) -> dict:
    """Completed, hit rate (%), TTFT p50/p99 (ms), output tok/s and imbalance of one run."""
    done = [r for r in results if r["ok"]]
    prompt = sum(r["usage"]["prompt_tokens"] for r in done)
    details = [r["usage"].get("prompt_tokens_details") or {} for r in done]
    cached = sum(d.get("cached_tokens", 0) for d in details)
    ttfts = [(r["first"] - r["sent"]) * 1e3 * speedup for r in done if r["first"] is not None]
    span = (max(r["end"] for r in done) - min(r["sent"] for r in done)) * speedup
    out = sum(r["usage"]["completion_tokens"] for r in done)
    return {
        "completed": len(done),
        "hit": 100 * cached / max(prompt, 1),
        "p50": percentile(ttfts, 0.5),
        "p99": percentile(ttfts, 0.99),
        "tok_s": out / span,
        "imbalance": max(counts) / (sum(counts) / len(counts)) if sum(counts) else float("nan"),
    }


def _fleet_args(args: argparse.Namespace, model: str, overlay: Path) -> list[str]:
    fleet = ["-o", str(overlay), "--served-model-name", model]
    fleet += ["--context-length", str(CONTEXT), "--worker-http", "auto"]
    # A worker on a loaded machine may miss the default 1 s of heartbeats without being dead.
    fleet += ["--heartbeat-timeout", "30"]
    for name, value in OPEN_LIMITS.items():
        fleet += ["--http-limit", f"{name}={value}"]
    return fleet


def run_real(args, trace, model: str, overlay: Path, policy: str, log) -> dict:
    """The trace through sglang-router ``--policy policy`` over a fresh fleet's workers."""
    fleet, ready = start_fleet(args.workers, *_fleet_args(args, model, overlay))
    try:
        urls = [worker["http"] for worker in ready["workers"]]
        port = int(free_endpoint().rsplit(":", 1)[1])
        command = [args.router_python, "-m", "sglang_router.launch_router"]
        command += ["--host", "127.0.0.1", "--port", str(port), "--policy", policy]
        command += ["--model-path", model, "--tokenizer-path", model, "--worker-urls", *urls]
        router = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url)
            results = asyncio.run(drive(url, trace, model, args.speedup))
        finally:
            router.terminate()
            router.wait(10)
        return figures(results, args.speedup, requests_per_worker(urls))
    finally:
        stop_serve(fleet, timeout=60)


def run_ours(args, trace, model: str, overlay: Path, policy: str) -> dict:
    """The trace through ``schedkit fleet --http --router policy`` over the same workers."""
    extra = ["--http", "127.0.0.1:0", "--router", policy]
    fleet, ready = start_fleet(args.workers, *_fleet_args(args, model, overlay), *extra)
    try:
        url = ready["http"]
        wait_healthy(url)
        results = asyncio.run(drive(url, trace, model, args.speedup))
        urls = [worker["http"] for worker in ready["workers"]]
        return figures(results, args.speedup, requests_per_worker(urls))
    finally:
        stop_serve(fleet, timeout=60)


def _spread(values: list[float], digits: int) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return " / ".join(f"{v:,.{digits}f}" for v in (low, mid, high))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router-python", default=sys.executable)
    parser.add_argument("--trace", choices=("mooncake", "azure"), default="mooncake")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=None, help="default 8 / 40 per second")
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--speedup", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rows", default="real-cache_aware,real-round_robin,sglang,round_robin")
    args = parser.parse_args(argv)
    rate = args.rate or (8.0 if args.trace == "mooncake" else 40.0)
    from schedkit.runner.presets import preset_overlay
    from schedkit.runner.time_scale import faster_model

    with tempfile.TemporaryDirectory(prefix="sglang-router-real-") as tmp:
        directory = Path(tmp)
        model = str(model_directory(directory))
        if args.trace == "mooncake":
            trace = mooncake_texts(args.requests, rate, args.seed, args.block, directory)
        else:
            trace = azure_texts(args.requests, rate, args.seed, directory)
        from schedkit import wirings
        from schedkit.assembly.loading import load_wiring

        h100 = preset_overlay(load_wiring(wirings.path()), "llama3-8b", "h100")[0]
        overlay = directory / "h100.yaml"
        overlay.write_text(json.dumps(faster_model(h100, args.speedup)))
        print(
            f"{args.trace}-shaped trace: {args.requests} requests at {rate:g}/s (seed "
            f"{args.seed}); {args.workers} workers, llama3-8b on h100, trace and model "
            f"{args.speedup:g}x faster (latencies x{args.speedup:g}); {args.repeat} rounds, rows "
            "interleaved; figures min / median / max"
        )
        names = [n for n in args.rows.split(",") if n]
        runs: dict[str, list[dict]] = {name: [] for name in names}
        with (directory / "router.log").open("a") as log:
            for round_ in range(args.repeat):
                for name in names:
                    if name.startswith("real-"):
                        run = run_real(args, trace, model, overlay, name[5:], log)
                    else:
                        run = run_ours(args, trace, model, overlay, name)
                    runs[name].append(run)
                    print(f"round {round_ + 1}: {name}: {run}", file=sys.stderr, flush=True)
    print(
        "| router | completed | hit rate % | TTFT p50 ms | TTFT p99 ms | output tok/s "
        "| load imbalance |"
    )
    print("|---|---|---|---|---|---|---|")
    label = {
        "real-cache_aware": "sglang-router 0.3.2 cache_aware",
        "real-round_robin": "sglang-router 0.3.2 round_robin",
    }
    for name, results in runs.items():
        done = sum(r["completed"] for r in results)
        cells = [f"{done}/{args.requests * len(results)}", _spread([r["hit"] for r in results], 1)]
        cells += [_spread([r[k] for r in results], 1) for k in ("p50", "p99")]
        cells += [_spread([r["tok_s"] for r in results], 0)]
        cells += [_spread([r["imbalance"] for r in results], 2)]
        print(f"| {label.get(name, 'schedkit ' + name)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
