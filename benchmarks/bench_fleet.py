"""Every routing policy over a fleet of 8 schedulers (llama3-8b on the h100 preset), on a
Mooncake-shaped trace and on a no-sharing Azure-shaped trace: offline in open loop and in
closed loop, and live.

Traces (``schedkit.workloads.shaped``, generated, no real trace): Mooncake-shaped (hot first
block shared by every request, arrivals in 3-second bursts, prompts mean ~12k / p99 ~85k
tokens, ~37% of block references repeated) at ``--mooncake-rate`` requests per second, and
Azure-shaped conversation traffic (prompts mean ~1.2k tokens, nothing shared) at
``--azure-rate``. Replays:

- ``open``: offline, each request at its time in the trace
  (``schedkit.fleet.offline.OfflineFleet``, one virtual timeline: the same trace, wiring and
  seed give the same figures);
- ``closed``: offline, ``--mooncake-concurrency`` / ``--azure-concurrency`` clients each
  sending the trace's next request when its previous one ended (``ClosedLoop``);
- ``live``: the first ``--live-requests`` of the trace through ``schedkit.fleet.LiveFleet``
  (a process per worker, ZeroMQ, KV events over sockets, the wall clock), for
  ``--live-policies``. With ``--live-speedup X`` the trace and the model both run X times
  faster (``schedkit.runner.time_scale``), which keeps the queues of the unscaled run; the
  table gives live latencies multiplied back by X and throughputs divided by X.

Offline runs each go in a fresh process; live fleets are started from this one.

Printed: one table, per trace, replay and policy, of the prefix-cache hit rate, TTFT p50 and
p99 and queue time p99 (ms: simulated offline, wall-clock live), output throughput (tokens
per second of the same clock, over the whole run), the load imbalance (most requests routed
to one worker over the mean), and the wall seconds of the run. ``--plot FILE.png`` draws each
worker's requests held (running + queued) over time, one panel per trace, replay and policy
(needs matplotlib: ``pip install 'schedkit[plot]'``).

Usage: ``python benchmarks/bench_fleet.py [--requests N] [--policies a,b] [--modes
open,closed,live] [--traces mooncake,azure] [--seed N] [--plot FILE]`` (``--quick``: 600
requests per trace, 200 live).
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing
import tempfile
import time
from pathlib import Path

import structlog

from schedkit.assembly.loading import load_wiring
from schedkit.cli.args import number
from schedkit.fleet.live import LiveFleet
from schedkit.fleet.offline import run_offline
from schedkit.fleet.replay import ClosedLoop, replay_mode
from schedkit.fleet.summary import FleetSummary
from schedkit.router import POLICIES
from schedkit.runner.presets import preset_overlay
from schedkit.runner.time_scale import faster_model
from schedkit.sim.plot import INSTALL_HINT, PlotError, require_matplotlib
from schedkit.workloads.shaped import write_azure_shaped, write_mooncake_shaped
from schedkit.workloads.traces import open_trace
from schedkit.workloads.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
WIRING = ROOT / "wiring.yaml"
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
LIVE_DEFAULT = "round_robin,kv,sglang,dynamo"
MODES = ("open", "closed", "live")


def h100() -> dict:
    """The llama3-8b on h100 preset's overlay."""
    return preset_overlay(load_wiring(WIRING), "llama3-8b", "h100")[0]


def _quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def result(summary: FleetSummary, wall: float, scale: float = 1.0) -> dict:
    """What the table and the plot need of a run: its figures on the h100's time scale
    (``scale``: the live speedup), its wall seconds and each worker's held requests over
    time (seconds on the same scale)."""
    f = summary.fleet

    def ms(seconds: float) -> float | None:
        return None if math.isnan(seconds) else seconds * scale * 1e3

    return {
        "hit_rate": f.prefix_cache_hit_rate,
        "ttft_p50_ms": ms(f.ttft_p50_s),
        "ttft_p99_ms": ms(f.ttft_p99_s),
        "queue_p99_ms": ms(f.queue_time_p99_s),
        "output_tok_per_s": f.output_throughput_tok_per_s / scale,
        "done": f.requests_done,
        "not_done": summary.requests_not_done,
        "load_imbalance": summary.load_imbalance,
        "wall_s": wall,
        "timelines": [
            (
                [t * scale for t in w.timeline.seconds],
                [r + q for r, q in zip(w.timeline.running, w.timeline.queued, strict=True)],
            )
            for w in summary.workers
        ],
    }


def _workload(path: str, fmt: str, concurrency: int | None, speedup: float = 1.0) -> Workload:
    workload = open_trace(path, fmt, speedup=speedup)
    return workload if concurrency is None else ClosedLoop(workload, concurrency)


def run_offline_policy(
    path: str, fmt: str, policy: str, workers: int, concurrency: int | None
) -> dict:
    """One offline run (open loop, or closed loop at ``concurrency``) in this process."""
    _quiet()
    started = time.perf_counter()
    summary = run_offline(
        WIRING,
        _workload(path, fmt, concurrency),
        workers,
        policy,
        overlays=[h100()],
        replay=replay_mode(concurrency, None),
    )
    return result(summary, time.perf_counter() - started)


def run_live_policy(
    path: str, fmt: str, policy: str, workers: int, requests: int, speedup: float
) -> dict:
    """One live run of the trace's first ``requests`` requests, the trace and the model
    ``speedup`` times faster."""
    _quiet()
    workload = open_trace(path, fmt, speedup=speedup, num_requests=requests)
    overlay = faster_model(h100(), speedup)
    started = time.perf_counter()
    with LiveFleet(WIRING, workers, policy, overlays=[overlay]) as fleet:
        summary = fleet.run(workload)
    return result(summary, time.perf_counter() - started, speedup)


def row(trace: str, replay: str, policy: str, r: dict) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"
    not_done = f" ({r['not_done']} not done)" if r["not_done"] else ""
    return (
        f"| {trace} | {replay} | {policy} | {hit} | {ms(r['ttft_p50_ms'])} | "
        f"{ms(r['ttft_p99_ms'])} | {ms(r['queue_p99_ms'])} | "
        f"{r['output_tok_per_s']:,.0f} | {r['load_imbalance']:.2f}{not_done} | "
        f"{r['wall_s']:.0f} |"
    )


def plot(results: dict[tuple[str, str, str], dict], path: str) -> dict:
    """Draw each run's per-worker held requests over time into ``path``, one panel per
    (trace, replay) column and policy row; returns the series drawn, per run, as read back
    from the figure ({key: [(xs, ys) per worker]})."""
    plt = require_matplotlib()
    columns = list(dict.fromkeys((trace, replay) for trace, replay, _ in results))
    rows = list(dict.fromkeys(policy for _, _, policy in results))
    fig, axes = plt.subplots(
        len(rows), len(columns), figsize=(4.5 * len(columns), 2.2 * len(rows)), squeeze=False
    )
    drawn = {}
    for i, policy in enumerate(rows):
        for j, (trace, replay) in enumerate(columns):
            ax = axes[i, j]
            key = (trace, replay, policy)
            if key not in results:
                ax.set_axis_off()
                continue
            for rank, (xs, ys) in enumerate(results[key]["timelines"]):
                ax.plot(xs, ys, linewidth=0.7, label=f"worker {rank}")
            drawn[key] = [(list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()]
            ax.set_title(f"{trace}, {replay}: {policy}", fontsize="small")
            if j == 0:
                ax.set_ylabel("requests held")
    for ax in axes[-1, :]:
        ax.set_xlabel("seconds (simulated; live: wall x speedup)")
    axes[0, 0].legend(ncol=4, fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return drawn


def _policies(text: str, parser: argparse.ArgumentParser, option: str) -> list[str]:
    names = [p for p in text.split(",") if p]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        parser.error(
            f"{option}: unknown policies {', '.join(unknown)}; valid: {', '.join(sorted(POLICIES))}"
        )
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--requests", type=number(int), default=1000, help="per trace, offline")
    parser.add_argument("--live-requests", type=number(int), default=400, help="per trace")
    parser.add_argument("--quick", action="store_true", help="600 requests per trace, 200 live")
    parser.add_argument("--workers", type=number(int), default=8)
    parser.add_argument("--mooncake-rate", type=number(float), default=8.0)
    parser.add_argument("--azure-rate", type=number(float), default=40.0)
    parser.add_argument("--mooncake-concurrency", type=number(int), default=32)
    parser.add_argument("--azure-concurrency", type=number(int), default=64)
    parser.add_argument("--live-speedup", type=number(float), default=1.0)
    parser.add_argument("--seed", type=number(int), default=0, help="of both traces")
    parser.add_argument("--modes", default=",".join(MODES), help="of open, closed, live")
    parser.add_argument("--traces", default="mooncake,azure", help="of mooncake, azure")
    parser.add_argument("--policies", default=",".join(ORDER), help="comma-separated names")
    parser.add_argument("--live-policies", default=LIVE_DEFAULT, help="comma-separated names")
    parser.add_argument("--plot", metavar="FILE.png", help="load over time (needs matplotlib)")
    args = parser.parse_args()
    policies = _policies(args.policies, parser, "--policies")
    live_policies = _policies(args.live_policies, parser, "--live-policies")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: {args.modes!r}; valid: a comma-separated list of {MODES}")
    wanted = [t for t in args.traces.split(",") if t]
    if not wanted or any(t not in ("mooncake", "azure") for t in wanted):
        parser.error(f"--traces: {args.traces!r}; valid: a comma-separated list of mooncake, azure")
    n = 600 if args.quick else args.requests
    n_live = min(n, 200 if args.quick else args.live_requests)
    if args.plot:
        try:
            require_matplotlib()
        except PlotError:
            print(f"no plot: matplotlib is not installed ({INSTALL_HINT}), {args.plot} not written")
            args.plot = None
    with tempfile.TemporaryDirectory() as tmp:
        mooncake = write_mooncake_shaped(
            Path(tmp) / "mc.jsonl", n, seed=args.seed, rate=args.mooncake_rate
        )
        azure = write_azure_shaped(Path(tmp) / "az.csv", n, seed=args.seed, rate=args.azure_rate)
        traces = [
            (
                f"mooncake-shaped {args.mooncake_rate:g}/s",
                str(mooncake),
                "mooncake",
                args.mooncake_concurrency,
            ),
            (f"azure-shaped {args.azure_rate:g}/s", str(azure), "azure", args.azure_concurrency),
        ]
        traces = [t for t in traces if t[2] in wanted]
        print(
            f"{args.workers} workers, llama3-8b on h100; seed {args.seed}; offline: {n} requests "
            f"per trace; live: the first {n_live}, trace and model {args.live_speedup:g}x faster, "
            f"figures scaled back"
        )
        print()
        print(
            "| trace | replay | router | hit rate | TTFT p50 ms | TTFT p99 ms | queue p99 ms "
            "| output tok/s | load imbalance | wall s |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        results = {}
        spawn = multiprocessing.get_context("spawn")
        for label, path, fmt, concurrency in traces:
            for mode in modes:
                for policy in live_policies if mode == "live" else policies:
                    if mode == "live":
                        replay = f"live, {n_live} req"
                        r = run_live_policy(
                            path, fmt, policy, args.workers, n_live, args.live_speedup
                        )
                    else:
                        clients = concurrency if mode == "closed" else None
                        replay = "open loop" if clients is None else f"closed loop, {clients}"
                        with spawn.Pool(1) as pool:
                            r = pool.apply(
                                run_offline_policy, (path, fmt, policy, args.workers, clients)
                            )
                    results[label, replay, policy] = r
                    print(row(label, replay, policy, r), flush=True)
    if args.plot:
        plot(results, args.plot)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
