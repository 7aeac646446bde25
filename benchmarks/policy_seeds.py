"""Routing policies against round robin over several seeds of a generated trace (8 workers,
llama3-8b on h100, offline open loop): is a policy's margin on one seed noise or real?

For each seed's trace (Mooncake-shaped or the no-sharing Azure-shaped one,
``schedkit.workloads.shaped``) every policy of ``--policies`` runs on the same trace; printed
per seed: TTFT p50 / p99 (simulated ms), output tokens per second and the load imbalance (most
requests routed to one worker over the mean); then, per policy, each figure over round
robin's on the same seed as min / median / max over the seeds (p50 and p99: policy / round
robin, below 1 is better; throughput: the same, above 1 is better); and where each policy put
a request: the share of requests sent to a worker with prompt tokens queued for prefill while
another worker had none ("behind prefill", what a new prompt's first token waits for), and the
median of the prompt tokens queued on the chosen worker, over every request of every seed.

Usage: ``python benchmarks/policy_seeds.py [--trace azure|mooncake] [--policies
round_robin,dynamo,sglang,kv] [--seeds 5] [--requests 1000] [--rate 40]``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path
from typing import ClassVar

import attrs
import structlog

from schedkit.assembly.loading import load_wiring
from schedkit.cli.args import number
from schedkit.fleet.offline import run_offline
from schedkit.router.base import POLICIES, Candidates, register_policy
from schedkit.runner.presets import preset_overlay
from schedkit.workloads.shaped import write_azure_shaped, write_mooncake_shaped
from schedkit.workloads.traces import open_trace

ROOT = Path(__file__).resolve().parents[1]
WIRING = ROOT / "wiring.yaml"
WORKERS = 8


QUEUED: dict[str, list[tuple[int, int]]] = {}


def traced(name: str) -> str:
    """A registered copy of policy ``name`` recording, per routing, the prompt tokens queued
    for prefill on the chosen worker and on the least queued one (in ``QUEUED[name]``)."""
    label = f"{name}+queued"
    if label not in POLICIES:

        @register_policy
        @attrs.define(kw_only=True)
        class Traced(POLICIES[name]):
            name: ClassVar[str] = label

            def choose(self, c: Candidates) -> tuple[int, str]:
                rank, reason = super().choose(c)
                workers = c.loads.workers
                least = min(workers[r].prefill_tokens for r in c.ranks)
                QUEUED.setdefault(name, []).append((workers[rank].prefill_tokens, least))
                return rank, reason

    return label


def run(path: Path, fmt: str, policy: str, settings: dict) -> dict:
    """One offline open-loop run's TTFT p50/p99 (ms), output tok/s and load imbalance."""
    h100 = preset_overlay(load_wiring(WIRING), "llama3-8b", "h100")[0]
    s = run_offline(
        WIRING, open_trace(path, fmt), WORKERS, traced(policy), overlays=[h100], settings=settings
    )
    f = s.fleet
    return {
        "p50": f.ttft_p50_s * 1e3,
        "p99": f.ttft_p99_s * 1e3,
        "tok_s": f.output_throughput_tok_per_s,
        "imbalance": s.load_imbalance,
    }


def spread(values: list[float]) -> str:
    """min / median / max."""
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--trace", choices=("mooncake", "azure"), default="azure")
    parser.add_argument("--policies", default="round_robin,dynamo,sglang,kv")
    parser.add_argument("--setting", action="append", default=[], metavar="POLICY:KEY=VALUE")
    parser.add_argument("--seeds", type=number(int), default=5)
    parser.add_argument("--requests", type=number(int), default=1000)
    parser.add_argument("--rate", type=number(float), default=None, help="default 40 / 8 per s")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rate = args.rate or (40.0 if args.trace == "azure" else 8.0)
    policies = [p for p in args.policies.split(",") if p]
    if "round_robin" not in policies:
        policies.insert(0, "round_robin")
    settings: dict[str, dict] = {p: {} for p in policies}
    for item in args.setting:
        name, _, pair = item.partition(":")
        key, _, value = pair.partition("=")
        settings.setdefault(name, {})[key] = value
    print(
        f"{WORKERS} workers, llama3-8b on h100, offline open loop; {args.trace}-shaped trace, "
        f"{args.requests} requests at {rate:g}/s; per seed: TTFT p50 / p99 ms, output tok/s, "
        "load imbalance"
    )
    print()
    print(f"| seed | {' | '.join(policies)} |")
    print("|---" * (len(policies) + 1) + "|")
    ratios: dict[str, dict[str, list[float]]] = {
        p: {"p50": [], "p99": [], "tok_s": []} for p in policies
    }
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            if args.trace == "azure":
                path = write_azure_shaped(
                    Path(tmp) / f"az{seed}.csv", args.requests, seed=seed, rate=rate
                )
            else:
                path = write_mooncake_shaped(
                    Path(tmp) / f"mc{seed}.jsonl", args.requests, seed=seed, rate=rate
                )
            results = {p: run(path, args.trace, p, settings[p]) for p in policies}
            base = results["round_robin"]
            cells = []
            for p in policies:
                r = results[p]
                cells.append(
                    f"{r['p50']:,.1f} / {r['p99']:,.1f}, {r['tok_s']:,.0f}, {r['imbalance']:.2f}"
                )
                for key in ("p50", "p99", "tok_s"):
                    ratios[p][key].append(r[key] / base[key])
            print(f"| {seed} | {' | '.join(cells)} |", flush=True)
    print()
    print("over round robin on the same seed, min / median / max:")
    print()
    print("| policy | TTFT p50 | TTFT p99 | output tok/s |")
    print("|---|---|---|---|")
    for p in policies[1:]:
        r = ratios[p]
        print(f"| {p} | {spread(r['p50'])} | {spread(r['p99'])} | {spread(r['tok_s'])} |")
    print()
    print("| policy | behind prefill | median prompt tokens queued on the chosen worker |")
    print("|---|---|---|")
    for p in policies:
        queued = QUEUED.get(p, [])
        behind = sum(1 for chosen, least in queued if chosen > 0 and least == 0)
        median = statistics.median(chosen for chosen, _ in queued) if queued else 0
        print(f"| {p} | {behind / max(1, len(queued)):.1%} | {median:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
