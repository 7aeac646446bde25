"""Every scheduling policy on the default workload: ``schedkit run wiring.yaml`` with each
overlay of ``examples/policies/``, one subprocess per policy and seed.

Method: the simulated model runs on its virtual clock, so every figure is simulated time and
the same seed gives the same run (no pairing needed: there is no machine noise in it). Each
policy runs the default synthetic workload (``chat``, 400 requests) for every ``--seeds`` seed;
the table gives the median over seeds of each run's figure (one seed: that run's).

Usage: ``python benchmarks/compare_policies.py [--seeds 0 1 2] [-- extra schedkit run args]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLICIES = [
    "lpm",
    "fcfs",
    "priority",
    "lof",
    "random",
    "routing-key",
    "dfs-weight",
    "hrrn",
    "shortest-prefill-first",
]
COLUMNS = [
    ("hit rate", "prefix_cache_hit_rate", "{:.1%}"),
    ("TTFT p50 ms", "ttft_p50", "{:.0f}"),
    ("TTFT p99 ms", "ttft_p99", "{:.0f}"),
    ("queue p50 ms", "queue_time_p50", "{:.0f}"),
    ("ITL p50 ms", "itl_p50", "{:.1f}"),
    ("E2E p50 s", "e2e_p50", "{:.2f}"),
    ("out tok/s", "output_throughput", "{:.0f}"),
    ("retractions", "retractions", "{:.0f}"),
]
MILLISECONDS = {"ttft_p50", "ttft_p99", "queue_time_p50", "itl_p50"}


def run(policy: str, seed: int, extra: list[str]) -> dict:
    """One ``schedkit run`` of ``policy``'s overlay; its JSON summary."""
    overlay = ROOT / "examples" / "policies" / f"{policy}.yaml"
    cmd = [
        sys.executable, "-m", "schedkit.cli", "run", str(ROOT / "wiring.yaml"),
        "-o", str(overlay), "--json", "--seed", str(seed), *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{policy} (seed {seed}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("extra", nargs="*", help="more `schedkit run` arguments (after --)")
    args = parser.parse_args(argv)
    rows = []
    for policy in POLICIES:
        runs = [run(policy, seed, args.extra) for seed in args.seeds]
        cells = []
        for _, key, fmt in COLUMNS:
            value = statistics.median(r[key] for r in runs)
            cells.append(fmt.format(value * 1000 if key in MILLISECONDS else value))
        rows.append([policy, *cells])
    header = ["policy", *(name for name, _, _ in COLUMNS)]
    seeds = ", ".join(map(str, args.seeds))
    print(f"default workload (chat, 400 requests), seeds {seeds}; medians over seeds")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
