"""``schedkit run`` (a workload through an assembled scheduler, then a summary) and
``schedkit serve`` (take requests on the receiver's endpoint until SIGINT/SIGTERM)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any

import structlog

from schedkit.cli.args import add_wiring_args, number
from schedkit.container import Assembly, build
from schedkit.sim.driver import StuckError, drive
from schedkit.sim.workload import CHAT_RATE, SYNTHETIC, WorkloadError, load_jsonl, synthetic
from schedkit.wiring import load_wiring

__all__ = ["add_parsers"]

log = structlog.get_logger("schedkit.serve")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the ``run`` and ``serve`` sub-commands."""
    p = sub.add_parser("run", help="run a workload through the scheduler and print a summary")
    add_wiring_args(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--workload", metavar="FILE.jsonl", help="JSONL workload file")
    source.add_argument(
        "--synthetic",
        choices=sorted(SYNTHETIC),
        default="chat",
        help="built-in workload (default: chat)",
    )
    p.add_argument(
        "--num-requests",
        type=number(int),
        default=400,
        help="requests of a synthetic workload (default 400)",
    )
    p.add_argument(
        "--rate",
        type=number(float, allow_inf=True),
        default=None,
        help=f"arrivals per second, Poisson (chat: conversation starts, default {CHAT_RATE:g}; "
        "inf: all at once; a JSONL file's lines without 'arrival': all at once by default)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)"
    )
    p.set_defaults(run=cmd_run)

    p = sub.add_parser("serve", help="serve requests on the receiver endpoint until stopped")
    add_wiring_args(p)
    p.add_argument(
        "--grace",
        type=number(float, allow_minimum=True),
        default=5.0,
        help="seconds to finish in-flight requests on shutdown before aborting them",
    )
    p.set_defaults(run=cmd_serve)


def _progress_bar(total: int) -> Any:
    last = [0.0]

    def show(done: int, simulated: float) -> None:
        now = time.monotonic()
        if now - last[0] < 0.1 and done < total:
            return
        last[0] = now
        filled = int(30 * min(done, total) / total)
        print(
            f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} requests  "
            f"{simulated:8.2f} s simulated",
            end="",
            file=sys.stderr,
            flush=True,
        )

    return show


def cmd_run(args: argparse.Namespace) -> int:
    wiring = load_wiring(args.file, *args.overlay)
    try:
        if args.workload:
            workload = load_jsonl(args.workload, rate=args.rate, seed=args.seed)
        else:
            workload = synthetic(args.synthetic, args.num_requests, args.rate, args.seed)
    except WorkloadError as exc:
        print(f"schedkit run: {len(exc.errors)} problem(s) in the workload:", file=sys.stderr)
        for error in exc.errors:
            print(f"  {error}", file=sys.stderr)
        return 2
    total = len(workload.initial()) if args.workload else args.num_requests
    quiet = args.json or args.no_progress or not sys.stderr.isatty()
    show = None if quiet else _progress_bar(total)
    with build(wiring) as assembly:
        try:
            summary, _ = drive(assembly, workload, progress=show)
        except StuckError as exc:
            print(f"\nschedkit run: {exc}", file=sys.stderr)
            return 1
        finally:
            if show is not None:
                print(file=sys.stderr)
    if args.json:
        print(json.dumps(summary.to_dict()))
    else:
        print(summary.table())
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    wiring = load_wiring(args.file, *args.overlay)
    stop = threading.Event()
    with build(wiring) as assembly:
        if getattr(assembly["request_receiver"], "bound_endpoint", None) is None:
            print(
                "schedkit serve: the wiring's request_receiver takes no network requests; "
                "use a zmq_request_receiver (see examples/serve/serve.yaml)",
                file=sys.stderr,
            )
            return 2
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        _announce(assembly)
        assembly["scheduler"].serve(stop)
        _drain(assembly, args.grace)
    log.info("schedkit serve stopped")
    return 0


def _announce(assembly: Assembly) -> None:
    endpoints = {"requests": getattr(assembly["request_receiver"], "bound_endpoint", None)}
    if "output_sender" in assembly:
        endpoints["outputs"] = getattr(assembly["output_sender"], "bound_endpoint", None)
    if "kv_events_publisher" in assembly:
        endpoints["kv_events"] = getattr(assembly["kv_events_publisher"], "endpoint", None)
    log.info("schedkit serve ready", **{k: v for k, v in endpoints.items() if v})
    print(json.dumps({"ready": endpoints}), flush=True)


def _drain(assembly: Assembly, grace: float) -> None:
    """Finish in-flight requests within ``grace`` seconds, then abort what is left."""
    scheduler = assembly["scheduler"]
    scheduler.continue_generation()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and scheduler.step():
        pass
    left = [r.rid for r in scheduler.waiting_queue] + [r.rid for r in scheduler.running_batch.reqs]
    if scheduler.chunked_req is not None:
        left.append(scheduler.chunked_req.rid)
    for rid in left:
        scheduler.abort_request(rid)
    scheduler.on_idle()
    if left:
        log.warning("aborted in-flight requests at shutdown", count=len(left))
