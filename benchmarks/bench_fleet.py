"""Every routing policy over a fleet of 8 schedulers (llama3-8b on the h100 preset), on a
Mooncake-shaped trace and on a no-sharing Azure-shaped trace, offline.

Traces (``schedkit.workloads.shaped``, generated, no real trace): Mooncake-shaped (hot first
block shared by every request, arrivals in 3-second bursts, prompts mean ~12k / p99 ~85k
tokens, ~37% of block references repeated) at ``--mooncake-rate`` requests per second, and
Azure-shaped conversation traffic (prompts mean ~1.2k tokens, nothing shared) at
``--azure-rate``. Each policy runs in a fresh process on one virtual timeline
(``schedkit.fleet.OfflineFleet``): the same trace, wiring and seed give the same figures.

Printed: one table, per trace and policy, of the prefix-cache hit rate, TTFT p50 and p99
(simulated ms), output throughput (tokens per simulated second, over the whole run), the load
imbalance (most requests routed to one worker over the mean), and the wall seconds of the
run. With matplotlib, ``--plot FILE.png`` draws each worker's requests in flight (running +
queued) over simulated time, one panel per trace and policy.

Usage: ``python benchmarks/bench_fleet.py [--requests N] [--policies a,b] [--plot FILE]``
(``--quick``: 600 requests per trace).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import tempfile
import time
from pathlib import Path

import structlog

from schedkit.assembly.container import build
from schedkit.assembly.loading import load_wiring
from schedkit.cli.args import number
from schedkit.fleet.offline import OfflineFleet, kv_events_config, worker_wiring
from schedkit.router import POLICIES
from schedkit.runner.presets import preset_overlay
from schedkit.sim.plot import INSTALL_HINT, PlotError, require_matplotlib
from schedkit.workloads.shaped import write_azure_shaped, write_mooncake_shaped
from schedkit.workloads.traces import open_trace

ROOT = Path(__file__).resolve().parents[1]
WIRING = ROOT / "wiring.yaml"
WORKERS = 8
ORDER = [
    "round_robin",
    "kv",
    "sglang",
    "dynamo",
    "llm-d",
    "power_of_two",
    "least_loaded",
    "longest_prefix",
    "session",
]


def run_policy(trace: str, fmt: str, policy: str) -> dict:
    """One offline run in this process: the summary as a dict plus each worker's timeline."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    preset, _ = preset_overlay(load_wiring(WIRING), "llama3-8b", "h100")
    events = {"publisher": "queue", "endpoint": f"inproc://bench-{policy}", "replay_endpoint": None}
    wirings = [worker_wiring(WIRING, [preset], r, WORKERS, events) for r in range(WORKERS)]
    workload = open_trace(trace, fmt)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        assemblies = [stack.enter_context(build(w)) for w in wirings]
        fleet = OfflineFleet(assemblies, workload, policy, kv_events_config(wirings[0]))
        summary = fleet.run()
        timelines = [
            (
                list(s.tally.timeline.seconds),
                [
                    r + q
                    for r, q in zip(s.tally.timeline.running, s.tally.timeline.queued, strict=True)
                ],
            )
            for s in fleet.steppers
        ]
    out = summary.to_dict()
    out["wall"] = time.perf_counter() - started
    out["timelines"] = timelines
    return out


def row(trace: str, policy: str, r: dict) -> str:
    f = r["fleet"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:,.1f}"

    hit = "-" if f["prefix_cache_hit_rate"] is None else f"{f['prefix_cache_hit_rate']:.1%}"
    return (
        f"| {trace} | {policy} | {hit} | {ms(f['ttft_p50_s'])} | {ms(f['ttft_p99_s'])} | "
        f"{f['output_throughput_tok_per_s']:,.0f} | {r['load_imbalance']:.2f} | {r['wall']:.0f} |"
    )


def plot(results: dict[tuple[str, str], dict], path: str) -> None:
    try:
        plt = require_matplotlib()
    except PlotError:
        print(f"no plot: matplotlib is not installed ({INSTALL_HINT}), {path} not written")
        return
    keys = list(results)
    fig, axes = plt.subplots(len(keys), 1, figsize=(9, 2.2 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        for rank, (xs, ys) in enumerate(results[key]["timelines"]):
            ax.plot(xs, ys, linewidth=0.7, label=f"worker {rank}")
        ax.set(title=f"{key[0]}: {key[1]}", ylabel="requests in flight")
    axes[-1, 0].set(xlabel="simulated seconds")
    axes[0, 0].legend(ncol=4, fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot written to {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--requests", type=number(int), default=1000, help="per trace")
    parser.add_argument("--quick", action="store_true", help="600 requests per trace")
    parser.add_argument("--mooncake-rate", type=number(float), default=8.0)
    parser.add_argument("--azure-rate", type=number(float), default=40.0)
    parser.add_argument("--policies", default=",".join(ORDER), help="comma-separated names")
    parser.add_argument("--plot", metavar="FILE.png", help="load over time (needs matplotlib)")
    args = parser.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"unknown policies {', '.join(unknown)}; valid: {', '.join(sorted(POLICIES))}")
    n = 600 if args.quick else args.requests
    with tempfile.TemporaryDirectory() as tmp:
        mooncake = write_mooncake_shaped(Path(tmp) / "mc.jsonl", n, rate=args.mooncake_rate)
        azure = write_azure_shaped(Path(tmp) / "az.csv", n, rate=args.azure_rate)
        traces = {
            f"mooncake-shaped {args.mooncake_rate:g}/s": (str(mooncake), "mooncake"),
            f"azure-shaped {args.azure_rate:g}/s": (str(azure), "azure"),
        }
        print(f"{WORKERS} workers, llama3-8b on h100, offline; {n} requests per trace, seed 0")
        print()
        print(
            "| trace | router | hit rate | TTFT p50 ms | TTFT p99 ms | output tok/s "
            "| load imbalance | wall s |"
        )
        print("|---|---|---|---|---|---|---|---|")
        results = {}
        spawn = multiprocessing.get_context("spawn")
        for label, (path, fmt) in traces.items():
            for policy in policies:
                with spawn.Pool(1) as pool:
                    r = results[label, policy] = pool.apply(run_policy, (path, fmt, policy))
                print(row(label, policy, r), flush=True)
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
