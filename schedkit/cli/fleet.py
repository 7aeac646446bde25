"""``schedkit fleet``: N schedulers behind a router, offline on one virtual timeline."""

from __future__ import annotations

import argparse
import json
import sys

from schedkit.cli.args import add_wiring_args, number
from schedkit.cli.run import add_workload_args, progress_bar, workload_from_args
from schedkit.fleet.offline import run_offline
from schedkit.router import POLICIES
from schedkit.sim.driver import StuckError

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``fleet`` sub-command."""
    p = sub.add_parser("fleet", help="run a workload over N schedulers behind a KV-aware router")
    add_wiring_args(p)
    p.add_argument(
        "--workers", type=number(int), default=4, help="number of schedulers (default 4)"
    )
    p.add_argument(
        "--router",
        choices=sorted(POLICIES),
        default="kv",
        help="routing policy (default kv: SGLang's cache-aware rule)",
    )
    add_workload_args(p)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)"
    )
    p.set_defaults(run=cmd_fleet)


def cmd_fleet(args: argparse.Namespace) -> int:
    workload = workload_from_args(args, "fleet")
    if workload is None:
        return 2
    total = len(workload.arrivals) if args.workload else args.num_requests
    quiet = args.json or args.no_progress or not sys.stderr.isatty()
    show = None if quiet else progress_bar(total)
    try:
        summary = run_offline(
            args.file,
            workload,
            args.workers,
            args.router,
            overlays=args.overlay,
            progress=show,
        )
    except StuckError as exc:
        print(f"\nschedkit fleet: {exc}", file=sys.stderr)
        return 1
    finally:
        if show is not None:
            print(file=sys.stderr)
    print(json.dumps(summary.to_dict()) if args.json else summary.table())
    return 130 if summary.interrupted else 0
