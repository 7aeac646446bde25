"""A fleet of 8 schedulers behind the KV-aware router against round robin, on a Mooncake-shaped
trace.

(a) Offline (``schedkit.fleet.run_offline``): 8 workers assembled from ``wiring.yaml`` on one
    virtual timeline, a 20,000-request Mooncake-shaped trace (``write_mooncake_like``: shared
    system prompts with falling popularity, half the requests continuing a conversation, 512
    tokens per hash id, Poisson arrivals at 32 per second), routed by ``kv`` (SGLang's
    cache-aware rule over the workers' KV events, with the gateway's command-line defaults),
    by ``round_robin``, and by ``kv`` with the gateway's library defaults (0.5 / 32 / 1.1).
    Each policy runs in a fresh process, so that its peak RSS is its own. Printed per policy:
    prefix-cache hit rate, TTFT p50/p99 (simulated ms), load imbalance (max / mean requests per
    worker), wall time and the process's peak RSS (all 8 workers and the router); then per
    worker: requests, hit rate, TTFT p50 and the wall seconds spent in its scheduler steps.
(b) Live (``schedkit.fleet.LiveFleet``, skipped with ``--no-live``): the same 8 workers as
    processes on the wall clock with the first ``--live-requests`` requests of the trace (400),
    kv routing, to show each worker process's own peak RSS and uptime.

With matplotlib installed, ``--plot FILE.png`` draws per-worker hit rates and TTFT p50 of each
policy. Usage: ``python benchmarks/bench_fleet.py [--quick | --requests N] [--no-live]
[--plot FILE]`` (``--quick``: 2,000 requests).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import tempfile
import time
from pathlib import Path

import structlog

from schedkit.cli.args import number
from schedkit.fleet import FleetSummary, run_offline
from schedkit.fleet.live import LiveFleet
from schedkit.fleet.summary_table import fleet_table
from schedkit.sim.plot import INSTALL_HINT, PlotError, require_matplotlib
from schedkit.workloads.traces import open_trace, write_mooncake_like

ROOT = Path(__file__).resolve().parents[1]
WIRING = ROOT / "wiring.yaml"
WORKERS = 8
RATE = 32.0
# label -> (policy, settings): kv with the gateway's command-line defaults (0.3 / 64 / 1.5),
# round robin, and kv with the gateway's library defaults (CacheAwareConfig::default()).
POLICIES = {
    "kv": ("kv", {}),
    "round_robin": ("round_robin", {}),
    "kv 0.5/32/1.1": (
        "kv",
        {"cache_threshold": 0.5, "balance_abs_threshold": 32, "balance_rel_threshold": 1.1},
    ),
}


def offline(trace: str, policy: str, settings: dict) -> dict:
    """One offline run in this process; the summary as a dict (it crosses a process)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    workload = open_trace(trace, "mooncake")
    return run_offline(WIRING, workload, WORKERS, policy, settings=settings).to_dict()


def live(trace: str, num_requests: int) -> FleetSummary:
    workload = open_trace(trace, "mooncake", num_requests=num_requests)
    with LiveFleet(WIRING, WORKERS, "kv") as fleet:
        return fleet.run(workload)


def ms(seconds: float | None) -> str:
    """Milliseconds, or "-" for a figure nothing measured (null in the JSON)."""
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def pct(fraction: float | None) -> str:
    """A percentage, or "-" for a figure nothing measured (a worker that got no request)."""
    return "-" if fraction is None else f"{fraction:.1%}"


def print_offline(results: dict[str, dict], walls: dict[str, float]) -> None:
    print(f"(a) offline, {WORKERS} workers")
    print()
    print(
        "| router | hit rate | TTFT p50 (ms) | TTFT p99 (ms) | load imbalance | wall s "
        "| peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for policy, r in results.items():
        f = r["fleet"]
        print(
            f"| {policy} | {pct(f['prefix_cache_hit_rate'])} | {ms(f['ttft_p50_s'])} | "
            f"{ms(f['ttft_p99_s'])} | {r['load_imbalance']:.2f} | {walls[policy]:.1f} | "
            f"{f['peak_rss_mib']:.0f} |"
        )
    print()
    print("per worker: requests, hit rate, TTFT p50 (ms), wall s in its steps")
    print()
    print("| worker | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    for rank in range(WORKERS):
        cells = []
        for r in results.values():
            w = r["workers"][rank]
            cells.append(
                f"{w['requests_routed']}, {pct(w['prefix_cache_hit_rate'])}, "
                f"{ms(w['ttft_p50_s'])}, {w['wall_s']:.1f}"
            )
        print(f"| {rank} | " + " | ".join(cells) + " |")


def plot(results: dict[str, dict], path: str) -> None:
    try:
        plt = require_matplotlib()
    except PlotError:
        print(f"no plot: matplotlib is not installed ({INSTALL_HINT}), {path} not written")
        return
    fig, (hits, ttft) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(results)
    for i, (policy, r) in enumerate(results.items()):
        xs = [rank + i * width for rank in range(WORKERS)]
        hits.bar(
            xs, [(w["prefix_cache_hit_rate"] or 0) * 100 for w in r["workers"]], width, label=policy
        )
        ttft.bar(xs, [(w["ttft_p50_s"] or 0) * 1e3 for w in r["workers"]], width, label=policy)
    hits.set(title="prefix-cache hit rate per worker", xlabel="worker", ylabel="%")
    ttft.set(title="TTFT p50 per worker", xlabel="worker", ylabel="ms (simulated)")
    hits.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot written to {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="2,000 requests instead of 20,000")
    parser.add_argument("--requests", type=number(int), help="this many requests (a smoke run)")
    parser.add_argument("--no-live", action="store_true", help="skip (b)")
    parser.add_argument("--live-requests", type=number(int), default=400)
    parser.add_argument("--plot", metavar="FILE.png", help="per-worker plot (needs matplotlib)")
    args = parser.parse_args()
    num_requests = args.requests or (2000 if args.quick else 20000)
    with tempfile.TemporaryDirectory() as tmp:
        trace = str(Path(tmp) / "mooncake.jsonl")
        write_mooncake_like(trace, num_requests, seed=0, rate=RATE)
        print(f"trace: {num_requests} Mooncake-shaped requests at {RATE:g}/s, seed 0")
        results, walls = {}, {}
        spawn = multiprocessing.get_context("spawn")
        for label, (policy, settings) in POLICIES.items():
            started = time.perf_counter()
            with spawn.Pool(1) as pool:
                results[label] = pool.apply(offline, (trace, policy, settings))
            walls[label] = time.perf_counter() - started
        print_offline(results, walls)
        if args.plot:
            plot(results, args.plot)
        if not args.no_live:
            structlog.configure(
                wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING)
            )
            summary = live(trace, args.live_requests)
            print()
            print(f"(b) live, {WORKERS} worker processes, first {args.live_requests} requests, kv")
            print(fleet_table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
