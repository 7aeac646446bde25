"""Offline fleet replay speed: a Mooncake-shaped trace at 8 workers, this tree against a
reference checkout (e.g. an older commit), side by side.

The trace (``schedkit.workloads.shaped.write_mooncake_shaped``, seed 0): prompts of mean
~12k / p99 ~85k tokens sharing a hot first block, conversations continued 37% of the time,
arrivals in 3-second bursts at ``--rate`` requests/s (3.3 by default). Each side replays it
with ``schedkit fleet --offline --workers 8 --format mooncake --json`` and its own built-in
wiring (the default kv router), in a subprocess of its own Python: this venv's for this tree,
``DIR/.venv/bin/python`` (or ``--baseline-python``) for the checkout at ``--baseline DIR``.
The two sides simulate the same requests but with each tree's own cost model, so their
simulated figures need not agree; what is compared is the time a user waits for the replay.

Method. A pair is one run of each side on the ``--requests``-request trace; the order
alternates from pair to pair (baseline first in even pairs). Each run's CPU time is the
child's user + system time (``os.wait4``), which a busy machine inflates less than wall
time; wall time is printed beside it for the record. Per pair the ratio is baseline CPU / this
tree's CPU; min / median / max over ``--pairs`` pairs (5 by default) are printed and the target
(this tree at least 5x faster) is read on the median. ``--full N`` also replays an N-request
trace (12031: the size of the Mooncake conversation trace) once on each side, one after the
other, and prints both CPU and wall times and the cost per request.

Usage: ``python benchmarks/bench_offline_fleet.py [--baseline DIR] [--requests N] [--pairs P]
[--full N] [--quick]``; without ``--baseline`` only this tree is measured. Exits 0 whether the
target is met or not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from schedkit.cli.args import number
from schedkit.workloads.shaped import write_mooncake_shaped

WORKERS = 8
TARGET = 5.0
MIN_PAIRS = 5


class RunFailed(RuntimeError):
    """A replay exited with an error (not 0, nor 3 for some failed requests)."""


def replay(python: str, trace: Path) -> dict:
    """One offline replay of ``trace`` with ``python``'s schedkit: its CPU and wall seconds
    and the requests it ended."""
    cmd = [python, "-m", "schedkit.cli", "fleet", "--offline", "--workers", str(WORKERS)]
    cmd += ["--workload", str(trace), "--format", "mooncake", "--json", "--no-progress"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=trace.parent)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if child.returncode not in (0, 3):  # 3: some requests failed (prompts past the pool)
            tail = err.read().decode(errors="replace")[-2000:]
            raise RunFailed(f"{' '.join(cmd)} exited {child.returncode}:\n{tail}")
        summary = json.loads(out.read().decode().strip().splitlines()[-1])
    fleet = summary["fleet"]
    return {
        "cpu": usage.ru_utime + usage.ru_stime,
        "wall": wall,
        "ended": fleet["requests_done"] + fleet["requests_failed"],
    }


def spread(values: list[float], fmt: str = ".2f") -> str:
    """min / median / max of ``values``."""
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of the reference tree")
    parser.add_argument("--baseline-python", help="its Python (default: DIR/.venv/bin/python)")
    parser.add_argument("--requests", type=number(int), default=300)
    parser.add_argument("--pairs", type=number(int), default=MIN_PAIRS)
    parser.add_argument("--rate", type=number(float), default=3.3)
    parser.add_argument("--full", type=number(int, allow_minimum=True), default=0)
    parser.add_argument("--quick", action="store_true", help="40 requests, 1 pair")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.pairs = 40, 1
    elif args.pairs < MIN_PAIRS:
        parser.error(f"--pairs must be at least {MIN_PAIRS} (or use --quick)")
    sides = {"this tree": sys.executable}
    if args.baseline is not None:
        python = args.baseline_python or str(args.baseline / ".venv" / "bin" / "python")
        if not Path(python).exists():
            parser.error(f"--baseline: no Python at {python}; give --baseline-python")
        sides = {"baseline": python, **sides}
    with tempfile.TemporaryDirectory() as tmp:
        trace = write_mooncake_shaped(Path(tmp) / "mc.jsonl", args.requests, rate=args.rate)
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for pair in range(args.pairs):
            order = list(sides) if pair % 2 == 0 else list(reversed(sides))
            for side in order:
                runs[side].append(replay(sides[side], trace))
        runs_of = "pairs" if "baseline" in sides else "runs"
        print(
            f"Mooncake-shaped trace, {args.requests} requests at {args.rate:g}/s, {WORKERS} "
            f"workers offline; {args.pairs} {runs_of}, CPU (user + system) of each replay, "
            "min / median / max"
        )
        for side, python in sides.items():
            cpu = [r["cpu"] for r in runs[side]]
            wall = [r["wall"] for r in runs[side]]
            per_request = [r["cpu"] / args.requests * 1e3 for r in runs[side]]
            print(
                f"{side} ({python}): CPU {spread(cpu)} s, wall {spread(wall)} s, "
                f"{spread(per_request)} ms CPU per request"
            )
        if "baseline" in sides:
            ratios = [
                b["cpu"] / t["cpu"]
                for b, t in zip(runs["baseline"], runs["this tree"], strict=True)
            ]
            met = "met" if statistics.median(ratios) >= TARGET else "NOT met"
            print(
                f"ratio (baseline / this tree CPU), {args.pairs} pairs, min / median / max = "
                f"{spread(ratios)}  target >= {TARGET:g} (median): {met}"
            )
        else:
            print("baseline: not measured; pass --baseline DIR (a checkout with its own venv)")
        if args.full:
            full = write_mooncake_shaped(Path(tmp) / "full.jsonl", args.full, rate=args.rate)
            for side, python in sides.items():
                run = replay(python, full)
                print(
                    f"{side}, {args.full} requests once: CPU {run['cpu']:.1f} s, wall "
                    f"{run['wall']:.1f} s, {run['cpu'] / args.full * 1e3:.2f} ms CPU per request "
                    f"({run['ended']} requests ended)"
                )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RunFailed as exc:
        print(f"bench_offline_fleet: {exc}", file=sys.stderr)
        sys.exit(1)
