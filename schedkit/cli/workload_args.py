"""The options ``schedkit run`` and ``schedkit fleet`` share: the workload (a trace file or a
built-in workload, its size, rate and seed) and how the summary shows (``--json``, the
progress bar)."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator

from schedkit.cli.args import number, print_problems
from schedkit.workloads.trace_formats import FORMATS
from schedkit.workloads.traces import open_trace
from schedkit.workloads.workload import CHAT_RATE, SYNTHETIC, Workload, WorkloadError, synthetic

__all__ = [
    "add_summary_args",
    "add_workload_args",
    "progress_bar",
    "progress_display",
    "workload_from_args",
]


def add_summary_args(p: argparse.ArgumentParser) -> None:
    """``--json`` (the summary as one JSON object) and ``--no-progress``."""
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)"
    )


def speedups(text: str) -> list[float]:
    """An argparse ``type``: one speedup or several, comma-separated (each > 0, finite)."""
    parse = number(float)
    return [parse(part.strip()) for part in text.split(",")]


def add_workload_args(p: argparse.ArgumentParser, *, speedup_sweep: bool = False) -> None:
    """The workload options: a workload or trace file or a built-in workload, its size, rate
    and seed. With ``speedup_sweep``, ``--speedup`` takes a comma-separated list (one run
    each)."""
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--workload", metavar="FILE", help="a workload or trace file, in the --format given"
    )
    source.add_argument(
        "--synthetic",
        choices=sorted(SYNTHETIC),
        default="chat",
        help="built-in workload (default: chat)",
    )
    p.add_argument(
        "--format",
        choices=list(FORMATS),
        help="format of the --workload file: "
        + "; ".join(f"{name}: {spec.describe}" for name, spec in FORMATS.items())
        + ". Default: jsonl, except that a .json file is taken as sharegpt (a .csv file needs "
        "--format azure or burstgpt)",
    )
    p.add_argument(
        "--trace-block-size",
        type=number(int),
        metavar="TOKENS",
        help="tokens per hash id of a mooncake trace (default 512)",
    )
    p.add_argument(
        "--speedup",
        type=speedups if speedup_sweep else number(float),
        metavar="X[,Y...]" if speedup_sweep else "X",
        help="divide the --workload file's arrival times by X (default 1)"
        + (
            "; several, comma-separated: one run each, then a table of the sweep"
            if speedup_sweep
            else ""
        ),
    )
    p.add_argument(
        "--num-requests",
        type=number(int),
        default=None,
        help="requests of a synthetic workload (default 400), or the first N of --workload "
        "(default all)",
    )
    p.add_argument(
        "--rate",
        type=number(float, allow_inf=True),
        default=None,
        help=f"arrivals per second, Poisson (chat: conversation starts, default {CHAT_RATE:g}; "
        "inf: all at once; for a jsonl file's lines without 'arrival' and a sharegpt file: "
        "all at once by default; timestamped traces take --speedup instead)",
    )
    p.add_argument("--seed", type=int, default=0)


def workload_from_args(args: argparse.Namespace, command: str) -> tuple[Workload, int] | None:
    """The workload the options ask for and its number of requests; None after printing
    every problem (of the file, or options that do not go together)."""
    trace_only = {"--format": args.format, "--trace-block-size": args.trace_block_size}
    trace_only["--speedup"] = args.speedup
    given = [flag for flag, value in trace_only.items() if value is not None]
    if given and not args.workload:
        print(f"schedkit {command}: {', '.join(given)} apply to --workload only", file=sys.stderr)
        return None
    try:
        if args.workload:
            workload = open_trace(
                args.workload,
                args.format,
                block_size=args.trace_block_size or 512,
                speedup=args.speedup or 1.0,
                rate=args.rate,
                seed=args.seed,
                num_requests=args.num_requests,
            )
            for note in workload.notes:
                print(f"schedkit {command}: note: {note}", file=sys.stderr)
            return workload, workload.num_requests
        total = args.num_requests or 400
        return synthetic(args.synthetic, total, args.rate, args.seed), total
    except WorkloadError as exc:
        print_problems(command, exc.errors, " in the workload")
    except ValueError as exc:
        print(f"schedkit {command}: {exc}", file=sys.stderr)
    return None


def progress_bar(total: int) -> Callable[[int, float], None]:
    """A progress line on stderr: ``show(done, simulated_seconds)``."""
    started = time.monotonic()
    last = [0.0]

    def show(done: int, simulated: float) -> None:
        now = time.monotonic()
        if now - last[0] < 0.1 and done < total:
            return
        last[0] = now
        filled = int(30 * min(done, total) / max(total, 1))
        eta = (now - started) / done * (total - done) if done else math.inf
        print(
            f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} requests  "
            f"{simulated:8.2f} s simulated  ETA {eta:5.0f} s",
            end="",
            file=sys.stderr,
            flush=True,
        )

    return show


@contextlib.contextmanager
def progress_display(
    args: argparse.Namespace, total: int
) -> Iterator[Callable[[int, float], None] | None]:
    """``progress_bar(total)`` when stderr is a terminal and neither ``--json`` nor
    ``--no-progress`` is given (else None); the bar's line is ended on the way out."""
    quiet = args.json or args.no_progress or not sys.stderr.isatty()
    show = None if quiet else progress_bar(total)
    try:
        yield show
    finally:
        if show is not None:
            print(file=sys.stderr)
