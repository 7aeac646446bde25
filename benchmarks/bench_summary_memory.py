"""Peak memory of a run's summary against the run itself.

A run keeps a few numbers per finished request and every inter-token latency (8 bytes each in
``array('d')``); its summary takes percentiles of them. This benchmark runs the built-in
``chat`` workload at a sustainable rate (4 conversations/s, 20,000 requests by default) on the
default wiring (KV events off: no sockets) in a fresh Python process per run, and reads the
process's peak resident memory (VmHWM on Linux) twice: when the last request has finished
(before the summary) and after the summary. Target: after <= 1.1x before.

Method: memory, not time; each run is its own process (a peak cannot be reset), the runs one
after another, 5 by default (``--runs``); the ratio is taken within each run and printed as
min / median / max with the median run's figures.

Usage: ``python benchmarks/bench_summary_memory.py [--quick] [--num-requests N] [--runs R]``;
exits 0 whether the target is met or not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

WIRING = Path(__file__).resolve().parents[1] / "wiring.yaml"
RATE = 4.0
TARGET = 1.1
CHILD = """
import json, logging, sys
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
import schedkit
from schedkit.sim.driver import drive, peak_rss_mb
from schedkit.workloads.workload import synthetic

wiring, num_requests, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
overlay = {"components": {"kv_events_publisher": {"args": {"kv_events_config": None}},
                          "tree_cache": {"args": {"enable_kv_cache_events": False}}}}
before = []
with schedkit.build(schedkit.load_wiring(wiring, overlay)) as assembly:
    summary = drive(
        assembly,
        synthetic("chat", num_requests, rate, 0),
        progress=lambda done, _: before.append(peak_rss_mb()) if done == num_requests else None,
    )
print(json.dumps({"before": before[-1], "after": summary.peak_rss_mb,
                  "tokens": summary.output_tokens, "done": summary.requests_done}))
"""


def run(num_requests: int) -> dict:
    """One run in a fresh process: peak RSS (MiB) before and after the summary."""
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(WIRING), str(num_requests), str(RATE)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 requests, one run")
    parser.add_argument("--num-requests", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    num_requests = 1000 if args.quick else args.num_requests
    runs = [run(num_requests) for _ in range(1 if args.quick else args.runs)]
    ratios = [r["after"] / r["before"] for r in runs]
    median = sorted(runs, key=lambda r: r["after"] / r["before"])[len(runs) // 2]
    print(
        f"chat, {num_requests} requests at {RATE:g} conversations/s, {len(runs)} runs: peak RSS "
        f"before the summary {median['before']:.1f} MiB, after {median['after']:.1f} MiB "
        f"(median run; {median['tokens']} tokens, {median['done']} requests done)"
    )
    verdict = "met" if statistics.median(ratios) <= TARGET else "NOT met"
    print(
        f"ratio (peak after / before the summary), min / median / max = {min(ratios):.3f} / "
        f"{statistics.median(ratios):.3f} / {max(ratios):.3f}  target <= {TARGET}: {verdict}"
    )


if __name__ == "__main__":
    main()
