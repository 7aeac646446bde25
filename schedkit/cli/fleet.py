"""``schedkit fleet``: N schedulers behind a router, each its own process on the wall clock,
or ``--offline`` all in this process on one virtual timeline."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from schedkit.cli.args import run_provenance, wiring_sources
from schedkit.cli.fleet_args import add_fleet_args, admission_limits, refused_options
from schedkit.cli.fleet_serve import serve_fleet, serves
from schedkit.cli.workload_args import progress_display, workload_from_args
from schedkit.fleet.capacity import FleetCapacityError
from schedkit.fleet.live import LiveFleet, WorkerStartError
from schedkit.fleet.offline import run_offline
from schedkit.fleet.plot import plot_fleet
from schedkit.fleet.records import request_writer
from schedkit.fleet.replay import ClosedLoop, replay_mode
from schedkit.fleet.summary import FleetSummary
from schedkit.fleet.summary_table import fleet_table
from schedkit.fleet.sweep import sweep_table
from schedkit.router import make_policy
from schedkit.sim.driver import StuckError
from schedkit.sim.plot import PlotError, check_plot_target
from schedkit.workloads.workload import Workload

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``fleet`` sub-command."""
    p = sub.add_parser("fleet", help="run a workload over N schedulers behind a KV-aware router")
    add_fleet_args(p)
    p.set_defaults(run=cmd_fleet)


def cmd_fleet(args: argparse.Namespace) -> int:
    """``schedkit fleet``: 0 when every request finished, 3 when some failed (or were
    refused with no admission limits asked for), 1 when a worker could not start or a
    scheduler got stuck, 2 on bad input (or more workers than the machine holds), 130 when
    interrupted. With ``--http``/``--worker-http`` it serves instead (``serve_fleet``)."""
    problem = refused_options(args)
    names = ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold")
    args.settings = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    args.settings.update(args.router_arg)
    try:
        make_policy(args.router, **args.settings)
        args.admission = admission_limits(args)
    except ValueError as exc:
        problem = problem or str(exc)
    if problem is None and args.plot:
        try:
            check_plot_target(args.plot)
        except PlotError as exc:
            problem = f"--plot: {exc}"
    if problem is not None:
        print(f"schedkit fleet: {problem}", file=sys.stderr)
        return 2
    if serves(args):
        return serve_fleet(args)
    sweep = args.speedup or [None]
    summaries: list[FleetSummary] = []
    with contextlib.ExitStack() as stack:
        out = None
        if args.output:
            out = stack.enter_context(open(args.output, "w", encoding="utf-8"))
        for speedup in sweep:
            args.speedup = speedup
            loaded = workload_from_args(args, "fleet")
            if loaded is None:
                return 2
            workload, total = loaded
            if args.concurrency is not None:
                workload = ClosedLoop(workload, args.concurrency)
            args.replay = replay_mode(args.concurrency, speedup)
            extra = {} if len(sweep) == 1 else {"speedup": speedup}
            args.record = None if out is None else request_writer(out, extra)
            try:
                run = _offline if args.offline else _live
                summaries.append(run(args, workload, total))
            except (StuckError, WorkerStartError) as exc:
                print(f"\nschedkit fleet: {exc}", file=sys.stderr)
                return 1
            except FleetCapacityError as exc:
                print(f"schedkit fleet: {exc}", file=sys.stderr)
                return 2
            if summaries[-1].interrupted:
                break
    _show(args, summaries, sweep)
    return _exit_code(args, summaries)


def _show(args: argparse.Namespace, summaries: list[FleetSummary], sweep: list) -> None:
    if args.plot:
        for speedup, summary in zip(sweep, summaries, strict=False):
            path = Path(args.plot)
            if len(sweep) > 1:
                path = path.with_name(f"{path.stem}-x{speedup:g}{path.suffix}")
            plot_fleet(summary, path)
            print(f"schedkit fleet: plot written to {path}", file=sys.stderr)
    if len(sweep) == 1:
        [summary] = summaries
        if args.json:
            print(json.dumps({"run": run_provenance(args), **summary.to_dict()}))
        else:
            print(fleet_table(summary))
        return
    if args.json:
        runs = [{"speedup": x, **s.to_dict()} for x, s in zip(sweep, summaries, strict=False)]
        print(json.dumps({"run": run_provenance(args), "sweep": runs}))
        return
    for speedup, summary in zip(sweep, summaries, strict=False):
        print(f"== speedup {speedup:g}\n{fleet_table(summary)}\n")
    print(sweep_table(sweep, summaries))


def _exit_code(args: argparse.Namespace, summaries: list[FleetSummary]) -> int:
    if any(s.interrupted for s in summaries):
        return 130
    failed = sum(s.fleet.requests_failed for s in summaries)
    refused = sum(s.fleet.requests_refused + s.fleet.requests_timed_out for s in summaries)
    if failed or (refused and not args.admission.configured):
        print(
            f"schedkit fleet: {failed} request(s) failed, {refused} refused or timed out"
            + ("" if args.admission.configured else " (no admission limits were asked for)"),
            file=sys.stderr,
        )
        return 3
    return 0


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
            heartbeat_timeout=args.heartbeat_timeout or 1.0,
            admission=args.admission,
            replay=args.replay,
            record=args.record,
            cap_workers=not args.no_worker_cap,
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
            admission=args.admission,
            replay=args.replay,
            record=args.record,
            cap_workers=not args.no_worker_cap,
            decode_runs=not args.step_by_step,
        )
