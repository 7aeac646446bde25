"""Scheduler speed on workload W1, with a zero-cost model so that only the scheduler is timed.

W1: 2,000 requests, all at once, 512-token prompts in 20 groups sharing a 384-token prefix,
128 output tokens each, at most 256 running (the default wiring's settings otherwise: a pool of
65,536 slots in pages of 16, LPM).

Method (every figure): CPU time (``time.process_time``: all threads of the process), never wall
time; the sides being compared run in this one process, interleaved run by run in an order that
rotates from one pair (or group) to the next; each ratio is taken within a pair and printed as
min / median / max over the pairs; targets are read on the median.

(a) Assembly cost: W1 through the scheduler assembled from ``wiring.yaml`` (with an overlay for
    the zero-cost model, KV events off and a dropping output sender) against the same
    components built by hand with keyword arguments and lambdas. Pairs: one run of each, 8
    pairs (``--quick``: 2). Target: <= 1.03.
(b) CPU per generated token, and per decode step (the whole run's CPU time over the number of
    decode steps), with KV events and streaming off, then on. Off: no KV-events config (the
    cache records nothing), requests not streaming and an output sender that drops what it is
    given. On: a ZeroMQ PUB publisher (with its replay socket) on free loopback ports and every
    request streaming every token, to the default wiring's ``output_tally`` (each message
    encoded as on the wire, then counted), and for comparison to the recording collector
    (encoded, decoded and kept, as tests use it). Groups: one run of each of the three, 9
    groups (``--quick``: 1); the ratios on / off are taken within each group. The scheduler
    thread's own CPU time is shown too. Target: on (output_tally) <= 1.4x off. The calibration
    line (CPU time of ``sum(range(10**6))``) shows how fast this machine runs pure Python.
(c) Against nano-vllm (only with ``--nano-vllm DIR``, a nano-vllm checkout at the commit named
    in ``nano_vllm_reference.py``): scheduler CPU per generated token, the model's forward left
    out on both sides, ours with events and streaming off, both on W1 at nano-vllm's block size
    of 256 tokens with a pool of ``NANO_POOL_TOKENS`` tokens. nano-vllm admits every waiting
    request its pool holds (its ``max_num_seqs`` bounds a step, not the running set), so the
    pool holds all 2,000 requests at once: neither side preempts, and the retractions and
    preemptions counted are printed to show it. Pairs: one run of each, 5 pairs (``--quick``:
    1). Target: ours <= 0.7x nano-vllm.

Usage: ``python benchmarks/bench_scheduler.py [--quick] [--nano-vllm DIR]``; exits 0 whether
targets are met or not.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from hand_built import DroppingSender, hand_built
from nano_vllm_reference import NanoVllmUnavailable, load_nano_vllm, run_nano_vllm

import schedkit
from schedkit.components.io.output_sender import InprocOutputCollector
from schedkit.runner.model_runner import SimulatedModelRunner
from schedkit.workloads.workload import shared_prefix_workload

ROOT = Path(__file__).resolve().parents[1]
WIRING = ROOT / "wiring.yaml"
TARGET_RATIO = 1.03
TARGET_ON_OFF = 1.4
TARGET_VS_NANO = 0.7
NANO_BLOCK_SIZE = 256
# Room for all 2,000 requests of W1 at once in nano-vllm (about two blocks of 256 each, their
# first block shared within a group), so that it never preempts; ours runs at most 256.
NANO_POOL_TOKENS = 8192 * NANO_BLOCK_SIZE
# What the calibration loop takes on a current desktop CPU, for the normalised estimate.
DESKTOP_CALIBRATION_MS = 12.5

# W1 and the quick smoke version of it.
FULL = {"num_requests": 2000, "output_len": 128, "pairs": 8, "groups": 9, "runs": 5}
QUICK = {"num_requests": 120, "output_len": 16, "pairs": 2, "groups": 1, "runs": 1}


def calibration_ms() -> float:
    """CPU milliseconds of ``sum(range(10**6))`` (best of 5): this machine's pure-Python speed."""
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        sum(range(10**6))
        best = min(best, time.process_time() - start)
    return best * 1e3


def overlay(events: bool, pool: tuple[int, int] | None = None) -> dict:
    """The wiring overlay: zero-cost model; KV events on free loopback ports, or off; the
    wiring's KV pool, or ``pool`` = (size, page size)."""
    components: dict[str, Any] = {"model_runner": {"args": {"zero_cost": True}}}
    if pool is not None:
        components["allocator"] = {"args": {"size": pool[0], "page_size": pool[1]}}
    if not events:
        components["kv_events_publisher"] = {"args": {"kv_events_config": None}}
        components["tree_cache"] = {"args": {"enable_kv_cache_events": False}}
    return {"components": components}


def yaml_assembly(
    events: bool,
    stream: bool,
    sender: Any = None,
    pool: tuple[int, int] | None = None,
    model: Any = None,
) -> schedkit.Assembly:
    """The default wiring with ``overlay(events, pool)``; a dropping sender unless streaming
    (then the wiring's own, or ``sender``); ``model`` in place of the model runner if given."""
    wiring = schedkit.load_wiring(WIRING, overlay(events, pool))
    if not stream:
        sender = DroppingSender()
    overrides = {} if sender is None else {"output_sender": sender}
    if model is not None:
        overrides["model_runner"] = model
    return schedkit.build(wiring, overrides=overrides)


def run_w1(
    components: Any, size: dict, stream: bool, clock: Callable[[], float]
) -> tuple[float, float, dict]:
    """Submit W1 and step until idle; returns (``clock`` seconds, scheduler-thread CPU
    seconds, counts)."""
    scheduler = components["scheduler"]
    workload = shared_prefix_workload(
        num_requests=size["num_requests"], output_len=size["output_len"], stream=stream
    )
    reqs = [arrival.req for arrival in workload.initial()]
    for req in reqs:
        scheduler.submit(req)
    gc.collect()
    start, thread_start = clock(), time.thread_time()
    scheduler.run_until_idle()
    elapsed, thread_elapsed = clock() - start, time.thread_time() - thread_start
    counts = {
        "tokens": sum(len(req.output_ids) for req in reqs),
        "finished": scheduler.finished_count,
        "decode_steps": components["metrics_reporter"].forward_ct_decode,
        "hit_rate": components["metrics_reporter"].stats.cache_hit_rate,
    }
    return elapsed, thread_elapsed, counts


def spread(values: list[float], digits: int = 3) -> str:
    """``min / median / max`` of ``values``."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{low:.{digits}f} / {mid:.{digits}f} / {high:.{digits}f}"


def rotated(sides: tuple[str, ...], i: int) -> tuple[str, ...]:
    """``sides`` in the order of pair ``i``: each side goes first in turn."""
    shift = i % len(sides)
    return sides[shift:] + sides[:shift]


def bench_assembly(size: dict) -> None:
    """(a): YAML-assembled vs hand-built CPU time, in pairs whose order alternates."""
    times: dict[str, list[float]] = {"yaml": [], "hand": []}
    results = {}
    for i in range(size["pairs"]):
        for kind in rotated(("yaml", "hand"), i):
            if kind == "yaml":
                with yaml_assembly(events=False, stream=False) as assembly:
                    cpu, _, counts = run_w1(assembly, size, False, time.process_time)
            else:
                cpu, _, counts = run_w1(hand_built(), size, False, time.process_time)
            times[kind].append(cpu)
            results[kind] = counts
    same = results["yaml"] == results["hand"]
    pairs = len(times["yaml"])
    print(f"(a) workload: {size['num_requests']} requests, {results['yaml']['tokens']} tokens")
    for name, key in (("YAML assembly", "yaml"), ("hand-built", "hand")):
        print(f"(a) {name + ':':15s} {spread(times[key])} s CPU (min / median / max, {pairs} runs)")
    ratios = [y / h for y, h in zip(times["yaml"], times["hand"], strict=True)]
    verdict = "met" if statistics.median(ratios) <= TARGET_RATIO else "NOT met"
    print(
        f"ratio a (YAML / hand-built CPU), {pairs} pairs, min / median / max = {spread(ratios)}"
        f"  target <= {TARGET_RATIO}: {verdict}"
    )
    print(f"(a) same results from both assemblies: {'yes' if same else 'NO'}")


def bench_cpu(size: dict, calibration: float) -> None:
    """(b): CPU per generated token and per decode step, events and streaming off / on, the
    three configurations interleaved in rotating order."""
    normalise = DESKTOP_CALIBRATION_MS / calibration
    configs = {
        "off": (False, None),
        "on (output_tally)": (True, None),
        "on (recording collector)": (True, InprocOutputCollector),
    }
    process: dict[str, list[float]] = {label: [] for label in configs}
    thread: dict[str, list[float]] = {label: [] for label in configs}
    counts: dict[str, dict] = {}
    for i in range(size["groups"]):
        for label in rotated(tuple(configs), i):
            on, sender = configs[label]
            fresh = None if sender is None else sender()
            with yaml_assembly(events=on, stream=on, sender=fresh) as assembly:
                cpu, thread_cpu, counts[label] = run_w1(assembly, size, on, time.process_time)
            process[label].append(cpu)
            thread[label].append(thread_cpu)
    groups = size["groups"]
    for label in configs:
        tokens, steps = counts[label]["tokens"], counts[label]["decode_steps"]
        per_token = [cpu / tokens * 1e6 for cpu in process[label]]
        per_step = [cpu / steps * 1e6 for cpu in process[label]]
        thread_token = statistics.median(thread[label]) / tokens * 1e6
        print(
            f"(b) events+streaming {label}: {spread(per_token)} us/token (min / median / max, "
            f"{groups} runs; ~{statistics.median(per_token) * normalise:.3f} on a desktop), "
            f"{spread(per_step, 1)} us/decode step; scheduler thread alone "
            f"{thread_token:.3f} us/token ({tokens} tokens, {steps} decode steps)"
        )
    for label in ("on (output_tally)", "on (recording collector)"):
        ratios = [on / off for on, off in zip(process[label], process["off"], strict=True)]
        verdict = "met" if statistics.median(ratios) <= TARGET_ON_OFF else "NOT met"
        print(
            f"ratio b {label} / off, {groups} groups, min / median / max = {spread(ratios, 2)}"
            + (f"  target <= {TARGET_ON_OFF}: {verdict}" if "tally" in label else "")
        )


class TimedModel:
    """A model runner that adds up the CPU time of its ``forward()`` calls, so that the model's
    own work can be left out of the scheduler's time (nano-vllm's side gets its tokens free)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.forward_cpu = 0.0

    def forward(self, batch: Any) -> Any:
        """``runner.forward(batch)``, timed."""
        start = time.process_time()
        result = self.runner.forward(batch)
        self.forward_cpu += time.process_time() - start
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)


def bench_nano_vllm(size: dict, checkout: str | None) -> None:
    """(c): scheduler CPU per generated token (the model's forward left out), ours with events
    and streaming off against nano-vllm's, both at block size 256 on W1, in pairs whose order
    alternates."""
    if checkout is None:
        print("(c) nano-vllm: not measured; pass --nano-vllm DIR (a nano-vllm checkout)")
        return
    try:
        nano = load_nano_vllm(checkout)
    except NanoVllmUnavailable as exc:
        print(f"(c) nano-vllm: not measured: {exc}")
        return
    workload = shared_prefix_workload(num_requests=size["num_requests"], output_len=1)
    prompts = [arrival.req.origin_input_ids for arrival in workload.initial()]
    pool = (NANO_POOL_TOKENS, NANO_BLOCK_SIZE)
    ours: list[float] = []
    theirs: list[float] = []
    retractions = preemptions = 0
    counts: dict = {}
    for i in range(size["runs"]):
        for side in rotated(("ours", "nano-vllm"), i):
            gc.collect()
            if side == "ours":
                model = TimedModel(SimulatedModelRunner(seed=0, clock="virtual", zero_cost=True))
                with yaml_assembly(events=False, stream=False, pool=pool, model=model) as assembly:
                    cpu, _, counts = run_w1(assembly, size, False, time.process_time)
                    retractions += assembly["scheduler"].num_retracted
                ours.append((cpu - model.forward_cpu) / counts["tokens"] * 1e6)
                continue
            try:
                nano_run = run_nano_vllm(
                    nano,
                    prompts,
                    size["output_len"],
                    block_size=NANO_BLOCK_SIZE,
                    pool_tokens=NANO_POOL_TOKENS,
                    max_num_seqs=256,
                    max_num_batched_tokens=16384,
                )
            except NanoVllmUnavailable as exc:
                print(f"(c) nano-vllm: not measured: {exc}")
                return
            preemptions += nano_run.preemptions
            theirs.append(nano_run.cpu / nano_run.tokens * 1e6)
    pairs = len(ours)
    print(
        f"(c) at block size {NANO_BLOCK_SIZE}, pool {NANO_POOL_TOKENS} tokens, model forward "
        f"left out, CPU us/token (min / median / max, {pairs} runs): ours {spread(ours)} "
        f"({counts['tokens']} tokens, {counts['decode_steps']} decode steps, {retractions} "
        f"retractions in all runs), nano-vllm {spread(theirs)} ({nano_run.tokens} tokens, "
        f"{nano_run.decode_steps} decode steps, {preemptions} preemptions in all runs)"
    )
    ratios = [o / t for o, t in zip(ours, theirs, strict=True)]
    verdict = "met" if statistics.median(ratios) <= TARGET_VS_NANO else "NOT met"
    print(
        f"ratio c (ours / nano-vllm), {pairs} pairs, min / median / max = {spread(ratios, 2)}"
        f"  target <= {TARGET_VS_NANO}: {verdict}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="a small workload (smoke test)")
    parser.add_argument(
        "--nano-vllm", metavar="DIR", help="a nano-vllm checkout to measure on the same workload"
    )
    args = parser.parse_args()
    size = QUICK if args.quick else FULL
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    # Free loopback ports for the KV-events publisher and its replay socket.
    os.environ["SCHEDKIT_KV_EVENTS_ENDPOINT"] = "tcp://127.0.0.1:0"
    os.environ["SCHEDKIT_KV_REPLAY_ENDPOINT"] = "tcp://127.0.0.1:0"
    calibration = calibration_ms()
    print(
        f"calibration: sum(range(10**6)) takes {calibration:.1f} ms of CPU here "
        f"(~{DESKTOP_CALIBRATION_MS} ms on a current desktop)"
    )
    bench_assembly(size)
    bench_cpu(size, calibration)
    bench_nano_vllm(size, args.nano_vllm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
