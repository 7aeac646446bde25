"""Live routing policies against round robin in interleaved rounds, with where each policy
put its requests: on the no-sharing Azure-shaped trace (or the Mooncake-shaped one), 8 worker
processes (llama3-8b on the h100 preset, wall clock) behind ``schedkit.fleet.LiveFleet``.

Each round runs every policy once, in turn, each on a fresh fleet, over the first
``--requests`` requests of the same trace. At each routing the router's load board is read as
the policy saw it: the reason the policy gave (``least_loaded``, ``imbalanced``, ``prefix``,
...), and whether the chosen worker had prompt tokens queued for prefill (routed, no first
token back yet) while another worker had none ("behind prefill"). The board counts a request
from its routing until its last output arrives, as the SGLang gateway's load guard counts it
from its forward until the response stream ends.

Printed: one line per round and policy (TTFT p50 / p99 ms, output tokens/s, load imbalance,
share behind prefill, TTFT p50 of the requests sent behind prefill and of the others), then
per policy min / median / max over the rounds, and each over round robin's figure of the same
round (min / median / max). With ``--speedup X`` the trace and the model run X times faster
and latencies are printed multiplied back by X.

Usage: ``python benchmarks/live_policy_rounds.py [--trace azure|mooncake] [--requests N]
[--rounds N] [--policies round_robin,sglang] [--speedup X]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections import Counter
from pathlib import Path

from bench_fleet import WIRING, _quiet, h100

from schedkit.cli.args import number
from schedkit.fleet.live import LiveFleet
from schedkit.runner.time_scale import faster_model
from schedkit.workloads.shaped import write_azure_shaped, write_mooncake_shaped
from schedkit.workloads.traces import open_trace


class RoutingLog:
    """Wraps a router's ``route``: per request id, the chosen rank, the policy's reason and
    whether the chosen rank had prefill queued while another had none."""

    def __init__(self, router) -> None:
        self.router = router
        self.inner = router.route
        self.decisions: dict[str, tuple[int, str, bool]] = {}

    def __call__(self, token_ids, among=None, **request):
        loads = self.router.loads.workers
        ranks = self.router.ranks if among is None else [r for r in self.router.ranks if r in among]
        queued = {r: loads[r].prefill_tokens for r in ranks}
        route = self.inner(token_ids, among, **request)
        behind = queued[route.rank] > 0 and min(queued.values()) == 0
        self.decisions[request["rid"]] = (route.rank, route.reason, behind)
        return route


def run_policy(path: str, fmt: str, policy: str, requests: int, speedup: float) -> dict:
    """One live run of the trace's first ``requests`` requests with ``policy``."""
    _quiet()
    workload = open_trace(path, fmt, speedup=speedup, num_requests=requests)
    ttfts: dict[str, float] = {}

    def record(req, _rank, outcome, _start) -> None:
        if outcome == "done" and req.first_token_time is not None:
            ttfts[req.rid] = (req.first_token_time - req.arrival_time) * speedup * 1e3

    with LiveFleet(WIRING, 8, policy, overlays=[faster_model(h100(), speedup)]) as fleet:
        log = RoutingLog(fleet.router)
        fleet.router.route = log
        fleet.record = record
        summary = fleet.run(workload)
    f = summary.fleet
    behind = [ttfts[rid] for rid, (_, _, b) in log.decisions.items() if b and rid in ttfts]
    others = [ttfts[rid] for rid, (_, _, b) in log.decisions.items() if not b and rid in ttfts]
    return {
        "p50": f.ttft_p50_s * speedup * 1e3,
        "p99": f.ttft_p99_s * speedup * 1e3,
        "tput": f.output_throughput_tok_per_s / speedup,
        "imbalance": summary.load_imbalance,
        "behind": len(behind) / max(1, len(log.decisions)),
        "behind_p50": statistics.median(behind) if behind else float("nan"),
        "others_p50": statistics.median(others) if others else float("nan"),
        "reasons": Counter(reason for _, reason, _ in log.decisions.values()),
    }


def spread(values: list[float], fmt: str) -> str:
    """min / median / max of ``values``."""
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--trace", choices=("azure", "mooncake"), default="azure")
    parser.add_argument("--requests", type=number(int), default=400)
    parser.add_argument("--rate", type=number(float), default=None, help="default 40 / 8 per s")
    parser.add_argument("--rounds", type=number(int), default=5)
    parser.add_argument("--policies", default="round_robin,sglang")
    parser.add_argument("--speedup", type=number(float), default=1.0)
    parser.add_argument("--seed", type=number(int), default=0)
    args = parser.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    if "round_robin" not in policies:
        policies.insert(0, "round_robin")
    with tempfile.TemporaryDirectory() as tmp:
        if args.trace == "azure":
            rate = args.rate or 40.0
            path = write_azure_shaped(Path(tmp) / "t.csv", args.requests, seed=args.seed, rate=rate)
        else:
            rate = args.rate or 8.0
            path = write_mooncake_shaped(
                Path(tmp) / "t.jsonl", args.requests, seed=args.seed, rate=rate
            )
        print(
            f"{args.trace}-shaped, {args.requests} requests at {rate:g}/s, seed {args.seed}; "
            f"8 workers, llama3-8b on h100, live, {args.speedup:g}x (latencies scaled back); "
            f"{args.rounds} rounds"
        )
        runs: dict[str, list[dict]] = {p: [] for p in policies}
        for i in range(args.rounds):
            for policy in policies:
                r = run_policy(str(path), args.trace, policy, args.requests, args.speedup)
                runs[policy].append(r)
                reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["reasons"].items()))
                print(
                    f"round {i} {policy}: TTFT p50 {r['p50']:.1f} p99 {r['p99']:.1f} ms, "
                    f"{r['tput']:,.0f} tok/s, imbalance {r['imbalance']:.2f}, behind prefill "
                    f"{r['behind']:.1%} (TTFT p50 {r['behind_p50']:.1f} ms; others "
                    f"{r['others_p50']:.1f}); {reasons}",
                    flush=True,
                )
    print()
    print(
        "| policy | TTFT p50 ms | TTFT p99 ms | output tok/s | load imbalance | behind prefill % "
        "| p50 / round robin | p99 / round robin | tok/s / round robin |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    base = runs["round_robin"]
    for policy, rs in runs.items():

        def ratio(key: str, rs: list[dict] = rs) -> str:
            return spread([r[key] / b[key] for r, b in zip(rs, base, strict=True)], ".3f")

        print(
            f"| {policy} | {spread([r['p50'] for r in rs], '.1f')} | "
            f"{spread([r['p99'] for r in rs], ',.1f')} | "
            f"{spread([r['tput'] for r in rs], ',.0f')} | "
            f"{spread([r['imbalance'] for r in rs], '.2f')} | "
            f"{spread([100 * r['behind'] for r in rs], '.1f')} | {ratio('p50')} | {ratio('p99')} | "
            f"{ratio('tput')} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
