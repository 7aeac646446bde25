"""``schedkit fleet``: N schedulers behind a router, each its own process on the wall clock,
or ``--offline`` all in this process on one virtual timeline."""

from __future__ import annotations

import argparse
import json
import sys

from schedkit.cli.args import add_wiring_args, number, run_provenance, wiring_sources
from schedkit.cli.workload_args import (
    add_summary_args,
    add_workload_args,
    progress_display,
    workload_from_args,
)
from schedkit.fleet.live import LAUNCHERS, LiveFleet, WorkerStartError
from schedkit.fleet.offline import run_offline
from schedkit.fleet.summary import FleetSummary
from schedkit.router import POLICIES, make_policy
from schedkit.sim.driver import StuckError
from schedkit.workloads.workload import Workload

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
    kv = p.add_argument_group("kv router settings (SGLang model gateway's cache-aware rule)")
    kv.add_argument(
        "--cache-threshold",
        type=number(float, allow_minimum=True),
        help="route by prefix when it covers more than this share of the prompt (default 0.3)",
    )
    kv.add_argument(
        "--balance-abs-threshold",
        type=number(int, allow_minimum=True),
        help="imbalanced when max - min requests in flight exceeds this (default 64)",
    )
    kv.add_argument(
        "--balance-rel-threshold",
        type=number(float, allow_minimum=True),
        help="... and max exceeds min times this (default 1.5)",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="all workers in this process on one virtual timeline (deterministic, fast)",
    )
    p.add_argument(
        "--launcher",
        choices=sorted(LAUNCHERS),
        default="process",
        help="live workers as processes (default) or Ray actors (pip install 'schedkit[ray]')",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=number(float),
        default=None,
        metavar="SECONDS",
        help="live: a worker silent this long is taken out of the routing (default 5)",
    )
    add_workload_args(p)
    add_summary_args(p)
    p.set_defaults(run=cmd_fleet)


def cmd_fleet(args: argparse.Namespace) -> int:
    """``schedkit fleet``: 0 after the summary, 1 when a worker could not start or the
    scheduler got stuck, 2 on bad input, 130 when interrupted."""
    live_only = {"--launcher": args.launcher != "process"}
    live_only["--heartbeat-timeout"] = args.heartbeat_timeout is not None
    given = [flag for flag, set_ in live_only.items() if set_]
    if args.offline and given:
        print(
            f"schedkit fleet: {', '.join(given)} apply to live workers; leave out --offline",
            file=sys.stderr,
        )
        return 2
    names = ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold")
    args.settings = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    try:
        make_policy(args.router, **args.settings)
    except ValueError as exc:
        print(f"schedkit fleet: {exc}", file=sys.stderr)
        return 2
    loaded = workload_from_args(args, "fleet")
    if loaded is None:
        return 2
    workload, total = loaded
    try:
        run = _offline if args.offline else _live
        summary = run(args, workload, total)
    except (StuckError, WorkerStartError) as exc:
        print(f"\nschedkit fleet: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"run": run_provenance(args), **summary.to_dict()}))
    else:
        print(summary.table())
    return 130 if summary.interrupted else 0


def _live(args: argparse.Namespace, workload: Workload, total: int) -> FleetSummary:
    file, overlays = wiring_sources(args)
    if not (args.json or args.no_progress):
        print(f"schedkit fleet: starting {args.workers} workers ...", file=sys.stderr, flush=True)
    with (
        LiveFleet(
            file,
            args.workers,
            args.router,
            overlays=overlays,
            settings=args.settings,
            launcher=args.launcher,
            heartbeat_timeout=args.heartbeat_timeout or 5.0,
        ) as fleet,
        progress_display(args, total) as show,
    ):
        summary = fleet.run(workload, progress=show)
    for rank, why in sorted(fleet.deaths.items()):
        print(f"schedkit fleet: worker {rank} was taken out: {why}", file=sys.stderr)
    return summary


def _offline(args: argparse.Namespace, workload: Workload, total: int) -> FleetSummary:
    file, overlays = wiring_sources(args)
    with progress_display(args, total) as show:
        return run_offline(
            file,
            workload,
            args.workers,
            args.router,
            overlays=overlays,
            settings=args.settings,
            progress=show,
        )
