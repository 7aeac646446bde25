"""Why the SGLang gateway's cache-aware rule loses to round robin on the TTFT tail of some
traces, and what its fallback has to do with it.

On each seed's trace (8 workers, llama3-8b on h100, offline) this runs round robin, ``sglang``
with the gateway's fallback (a cache miss goes to the worker with the fewest requests in
flight), ``sglang`` with ``fallback=least_prefill`` (the fewest prompt tokens queued for
prefill), ``kv`` (whose default fallback is ``least_prefill``) and ``kv`` with
``fallback=least_loaded``, and prints their TTFT p50 / p99. For ``sglang`` with the
gateway's fallback it then follows every routing decision: which rule took it (``prefix``:
the longest cached match above the threshold; ``least_loaded``: the fallback;
``imbalanced``: the balance rule) and how many prompt tokens were queued for prefill on the
chosen worker against the least such worker at that moment; and it prints that breakdown for
all requests and for the slowest 1% by TTFT.

Usage: ``python benchmarks/sglang_fallback.py [--trace mooncake|azure] [--seeds 5]
[--requests 300] [--rate 16] [--block 128]`` (the defaults are the direction test's trace:
Mooncake-shaped, its 512-token blocks scaled to 128, the same shape, shorter; ``--trace
azure`` writes the no-sharing Azure-shaped trace at ``--rate``).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from collections import Counter
from pathlib import Path
from typing import ClassVar

import attrs
import structlog

from schedkit.assembly.loading import load_wiring
from schedkit.cli.args import number
from schedkit.core.schedule_batch import Req
from schedkit.fleet.offline import run_offline
from schedkit.router.base import Candidates, register_policy
from schedkit.router.sglang import SglangCacheAware
from schedkit.runner.presets import preset_overlay
from schedkit.workloads.shaped import write_azure_shaped, write_mooncake_shaped
from schedkit.workloads.traces import open_trace

ROOT = Path(__file__).resolve().parents[1]
WIRING = ROOT / "wiring.yaml"
WORKERS = 8


@register_policy
@attrs.define(kw_only=True)
class TracedSglang(SglangCacheAware):
    """``sglang`` recording, per routing, its rule and the prefill tokens queued on the chosen
    worker and on the least such worker."""

    name: ClassVar[str] = "sglang-traced"
    decisions: ClassVar[list[tuple[str, int, int]]] = []
    routed: ClassVar[dict[str, tuple[str, int, int]]] = {}

    def choose(self, c: Candidates) -> tuple[int, str]:
        rank, reason = super().choose(c)
        workers = c.loads.workers
        least = min(workers[r].prefill_tokens for r in c.ranks)
        self.decisions.append((reason, workers[rank].prefill_tokens, least))
        return rank, reason

    def on_routed(self, c: Candidates, rank: int, rid: str) -> None:
        """Name the decision just taken by its request."""
        self.routed[rid] = self.decisions[-1]


def _run(
    path: Path, fmt: str, block: int, policy: str, settings: dict, ttfts: dict | None
) -> tuple:
    h100 = preset_overlay(load_wiring(WIRING), "llama3-8b", "h100")[0]
    workload = open_trace(path, fmt, block_size=block)

    def record(req: Req, worker: int | None, outcome: str, start: float) -> None:
        if ttfts is not None and req.first_token_time is not None:
            ttfts[req.rid] = req.first_token_time - req.arrival_time

    s = run_offline(
        WIRING, workload, WORKERS, policy, overlays=[h100], settings=settings, record=record
    )
    return s.fleet.ttft_p50_s * 1e3, s.fleet.ttft_p99_s * 1e3


def _breakdown(decisions: list[tuple[str, int, int]]) -> str:
    counts = Counter(reason for reason, _, _ in decisions)
    parts = []
    for reason in ("prefix", "least_loaded", "imbalanced"):
        mine = [(c, least) for r, c, least in decisions if r == reason]
        if not mine:
            continue
        behind = statistics.median(c - least for c, least in mine)
        parts.append(
            f"{reason} {counts[reason] / len(decisions):.0%} (median {behind:,.0f} tokens "
            "more queued than the least)"
        )
    return "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--trace", choices=("mooncake", "azure"), default="mooncake")
    parser.add_argument("--seeds", type=number(int), default=5)
    parser.add_argument("--requests", type=number(int), default=300)
    parser.add_argument("--rate", type=number(float), default=16.0)
    parser.add_argument("--block", type=number(int), default=128)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    shape = "Mooncake-shaped" if args.trace == "mooncake" else "Azure-shaped (no sharing)"
    blocks = f", {args.block}-token blocks" if args.trace == "mooncake" else ""
    print(
        f"{WORKERS} workers, llama3-8b on h100, offline; {shape}, {args.requests} requests at "
        f"{args.rate:g}/s{blocks}; TTFT p50 / p99 in simulated ms"
    )
    print()
    runs = [
        ("round_robin", "round_robin", {}),
        ("sglang (least_loaded)", "sglang-traced", {}),
        ("sglang least_prefill", "sglang", {"fallback": "least_prefill"}),
        ("kv (least_prefill)", "kv", {}),
        ("kv least_loaded", "kv", {"fallback": "least_loaded"}),
    ]
    print(f"| seed | {' | '.join(label for label, _, _ in runs)} |")
    print("|---" * (len(runs) + 1) + "|")
    traced = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            if args.trace == "mooncake":
                path = write_mooncake_shaped(
                    Path(tmp) / f"mc{seed}.jsonl",
                    args.requests,
                    seed=seed,
                    rate=args.rate,
                    block_size=args.block,
                )
            else:
                path = write_azure_shaped(
                    Path(tmp) / f"az{seed}.csv", args.requests, seed=seed, rate=args.rate
                )
            ttfts: dict[str, float] = {}
            TracedSglang.decisions.clear()
            TracedSglang.routed.clear()
            cells = []
            for _, policy, settings in runs:
                traced_run = ttfts if policy == "sglang-traced" else None
                p50, p99 = _run(path, args.trace, args.block, policy, settings, traced_run)
                cells.append(f"{p50:,.1f} / {p99:,.1f}")
            print(f"| {seed} | {' | '.join(cells)} |", flush=True)
            slowest = sorted(ttfts, key=ttfts.get)[-max(1, len(ttfts) // 100) :]
            traced.append(
                (
                    seed,
                    _breakdown(list(TracedSglang.routed.values())),
                    _breakdown([TracedSglang.routed[rid] for rid in slowest]),
                )
            )
    print()
    print("sglang with the gateway's fallback, by the rule that routed each request:")
    for seed, every, slow in traced:
        print(f"- seed {seed}: all: {every}")
        print(f"  slowest 1%: {slow}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
