"""Scheduler cost per generated token when overloaded, against a sustainable arrival rate.

The default wiring (``wiring.yaml``, as ``schedkit run`` builds it, KV events on free loopback
ports) runs the built-in ``chat`` workload at a rate it sustains (conversations start at 4/s:
the waiting queue stays short, TTFT p99 well under a second) and at an overloading rate (64/s:
tens of thousands of requests wait). An overloaded scheduler runs bigger batches, so per token
it should cost no more than a sustainable one; any work that grows with the waiting queue shows
up as a ratio above 1. Target: overloaded <= 1.3x sustainable.

Method. Both rates run the same conversations: the chat workload (``separate_streams``) draws
arrival times, first turns and each follow-up from random streams of their own, so the rate
changes only when requests arrive. A pair is one sustainable and one overloaded run in this
process, on the same seed, in an order that alternates from pair to pair; each pair has its
own seed (pair ``i`` uses seed ``i``). Each run's process CPU time (all threads,
``time.process_time``, not wall time) is divided by the tokens it generated, and by its decode
steps (per step: the whole run's CPU time over the decode steps, so prefill work is spread over
them). The ratio is taken within each pair; min / median / max over the pairs are printed
(``--runs`` pairs, 5 by default, at least 5 except with ``--quick``).

Usage: ``python benchmarks/bench_overload.py [--quick] [--num-requests N] [--runs R]``; exits
0 whether the target is met or not.
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import time
from pathlib import Path

import structlog
from bench_scheduler import calibration_ms

import schedkit
from schedkit.cli.args import number
from schedkit.sim.driver import drive
from schedkit.workloads.workload import ChatWorkload

WIRING = Path(__file__).resolve().parents[1] / "wiring.yaml"
SUSTAINABLE_RATE = 4.0
OVERLOADED_RATE = 64.0
TARGET = 1.3
MIN_PAIRS = 5
OVERLAY = {
    "components": {
        "kv_events_publisher": {
            "args": {
                "kv_events_config": {
                    "publisher": "zmq",
                    "endpoint": "tcp://127.0.0.1:0",
                    "replay_endpoint": "tcp://127.0.0.1:0",
                    "topic": "kv-events",
                }
            }
        }
    }
}
RATES = {"sustainable": SUSTAINABLE_RATE, "overloaded": OVERLOADED_RATE}


def run(num_requests: int, rate: float, seed: int) -> dict:
    """One ``chat`` run at ``rate``: CPU and wall seconds, tokens, decode steps and latency
    figures."""
    workload = ChatWorkload(num_requests=num_requests, rate=rate, seed=seed, separate_streams=True)
    with schedkit.build(schedkit.load_wiring(WIRING, OVERLAY)) as assembly:
        gc.collect()
        cpu, wall = time.process_time(), time.perf_counter()
        summary = drive(assembly, workload)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        steps = assembly["metrics_reporter"].forward_ct_decode
    return {
        "cpu": cpu,
        "wall": wall,
        "tokens": summary.output_tokens,
        "steps": steps,
        "ttft_p50": summary.ttft_p50,
        "ttft_p99": summary.ttft_p99,
        "peak_running": summary.peak_running_requests,
        "us_per_token": cpu / summary.output_tokens * 1e6,
        "us_per_step": cpu / steps * 1e6,
    }


def spread(values: list[float], digits: int = 2) -> str:
    """``min / median / max`` of ``values``."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{low:.{digits}f} / {mid:.{digits}f} / {high:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="1,000 requests, one pair")
    parser.add_argument("--num-requests", type=number(int), default=50000)
    parser.add_argument("--runs", type=number(int), default=MIN_PAIRS, help="pairs of runs")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    num_requests = 1000 if args.quick else args.num_requests
    pairs = 1 if args.quick else max(MIN_PAIRS, args.runs)

    print(f"calibration: sum(range(10**6)) takes {calibration_ms():.1f} ms of CPU here")
    results: dict[str, list[dict]] = {"sustainable": [], "overloaded": []}
    for i in range(pairs):
        order = ("sustainable", "overloaded") if i % 2 == 0 else ("overloaded", "sustainable")
        for kind in order:
            results[kind].append(run(num_requests, RATES[kind], seed=i))
    for kind, rate in RATES.items():
        runs = results[kind]
        print(
            f"{kind}: chat, {num_requests} requests, {rate:g} conversations/s, {pairs} runs "
            f"(CPU, min / median / max): "
            f"{spread([r['us_per_token'] for r in runs])} us per generated token, "
            f"{spread([r['us_per_step'] for r in runs], 0)} us per decode step "
            f"(median run: {statistics.median(r['tokens'] for r in runs):.0f} tokens, "
            f"{statistics.median(r['steps'] for r in runs):.0f} decode steps, "
            f"{statistics.median(r['cpu'] for r in runs):.1f} s CPU, "
            f"{statistics.median(r['wall'] for r in runs):.1f} s wall; TTFT p50 "
            f"{statistics.median(r['ttft_p50'] for r in runs):.2f} s, p99 "
            f"{statistics.median(r['ttft_p99'] for r in runs):.2f} s simulated; peak running "
            f"{statistics.median(r['peak_running'] for r in runs):.0f})"
        )
    pairs_of = list(zip(results["overloaded"], results["sustainable"], strict=True))
    ratios = [o["us_per_token"] / s["us_per_token"] for o, s in pairs_of]
    step_ratios = [o["us_per_step"] / s["us_per_step"] for o, s in pairs_of]
    verdict = "met" if statistics.median(ratios) <= TARGET else "NOT met"
    print(
        f"ratio (overloaded / sustainable per token), {pairs} pairs, min / median / max = "
        f"{spread(ratios)}  target <= {TARGET} (median): {verdict}"
    )
    print(f"ratio (overloaded / sustainable per decode step) = {spread(step_ratios)}")


if __name__ == "__main__":
    main()
