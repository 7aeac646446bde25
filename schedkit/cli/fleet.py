"""``schedkit fleet``: N schedulers behind a router, each its own process on the wall clock,
or ``--offline`` all in this process on one virtual timeline."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from schedkit.cli.args import add_wiring_args, number, run_provenance, wiring_sources
from schedkit.cli.fleet_serve import add_fleet_http_args, serve_fleet, serves
from schedkit.cli.workload_args import (
    add_summary_args,
    add_workload_args,
    progress_display,
    workload_from_args,
)
from schedkit.fleet.admission import AdmissionLimits, QueueLimits
from schedkit.fleet.capacity import FleetCapacityError
from schedkit.fleet.live import LAUNCHERS, LiveFleet, WorkerStartError
from schedkit.fleet.offline import run_offline
from schedkit.fleet.plot import plot_fleet
from schedkit.fleet.records import request_writer
from schedkit.fleet.replay import ClosedLoop, replay_mode
from schedkit.fleet.summary import FleetSummary
from schedkit.fleet.summary_table import fleet_table
from schedkit.fleet.sweep import sweep_table
from schedkit.router import POLICIES, make_policy
from schedkit.sim.driver import StuckError
from schedkit.sim.plot import PlotError, check_plot_target
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
        default="kv",
        metavar="POLICY",
        help=f"routing policy: {', '.join(sorted(POLICIES))}, or module:Class of one's own "
        "(default kv: SGLang's cache-aware rule over the KV events; docs/router.md)",
    )
    p.add_argument(
        "--router-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_router_arg,
        help="a setting of the routing policy (repeatable), e.g. --router-arg temperature=0.5",
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
        "--step-by-step",
        action="store_true",
        help="offline: run every scheduler step on its own instead of advancing unchanging "
        "decode batches several steps at once (the same results, slower)",
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
        help="live: a worker that sends no heartbeat (every 0.2 s) for this long is taken out "
        "of the routing (default 1)",
    )
    p.add_argument(
        "--no-worker-cap",
        action="store_true",
        help="start --workers even beyond what this machine holds (cores, memory)",
    )
    replay = p.add_argument_group("replay")
    replay.add_argument(
        "--concurrency",
        type=number(int),
        metavar="N",
        help="closed loop: N clients, each sending the workload's next request (in its order) "
        "when its previous one ended; arrival times are ignored (default: open loop)",
    )
    admission = p.add_argument_group(
        "admission control (refusals and timeouts are counted as such, never as latency)"
    )
    admission.add_argument(
        "--worker-max-requests",
        type=number(int),
        metavar="N",
        help="requests one worker holds, queued or running; beyond it the worker refuses",
    )
    admission.add_argument(
        "--worker-max-tokens",
        type=number(int),
        metavar="TOKENS",
        help="prompt tokens one worker holds, queued or running",
    )
    admission.add_argument(
        "--router-queue-requests",
        type=number(int),
        metavar="N",
        help="a queue at the router of at most N requests: what no worker has room for, or a "
        "worker refused, waits there instead of being refused",
    )
    admission.add_argument(
        "--router-queue-tokens",
        type=number(int),
        metavar="TOKENS",
        help="... and at most this many prompt tokens (needs --router-queue-requests)",
    )
    admission.add_argument(
        "--timeout",
        type=number(float),
        metavar="SECONDS",
        help="a request with no first token this long after its arrival is taken back and "
        "counted as timed out",
    )
    p.add_argument(
        "--output",
        metavar="FILE.jsonl",
        help="write one JSON record per request: its worker, outcome (done, refused, "
        "timed_out, failed), token counts and latencies in seconds",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw the fleet's latency CDFs and each worker's load over time into FILE (needs "
        "pip install 'schedkit[plot]'); a --speedup sweep writes FILE-xSPEEDUP.png per run",
    )
    add_workload_args(p, speedup_sweep=True)
    add_summary_args(p)
    add_fleet_http_args(p)
    p.set_defaults(run=cmd_fleet)


def _admission(args: argparse.Namespace) -> AdmissionLimits:
    """The admission limits the options ask for; ValueError when they do not go together."""
    if args.router_queue_tokens is not None and args.router_queue_requests is None:
        raise ValueError("--router-queue-tokens needs --router-queue-requests")
    router = None
    if args.router_queue_requests is not None:
        router = QueueLimits(
            max_requests=args.router_queue_requests, max_tokens=args.router_queue_tokens
        )
    return AdmissionLimits(
        worker=QueueLimits(
            max_requests=args.worker_max_requests, max_tokens=args.worker_max_tokens
        ),
        router=router,
        timeout=args.timeout,
    )


def _refused_options(args: argparse.Namespace) -> str | None:
    """What is wrong with the options together, or None."""
    live_only = {"--launcher": args.launcher != "process"}
    live_only["--heartbeat-timeout"] = args.heartbeat_timeout is not None
    given = [flag for flag, set_ in live_only.items() if set_]
    if args.offline and given:
        return f"{', '.join(given)} apply to live workers; leave out --offline"
    if args.concurrency is not None and args.speedup is not None:
        return "--concurrency replays in a closed loop, which ignores arrival times: no --speedup"
    if args.endpoints_file is not None and not serves(args):
        return "--endpoints-file needs --http or --worker-http"
    return None


def cmd_fleet(args: argparse.Namespace) -> int:
    """``schedkit fleet``: 0 when every request finished, 3 when some failed (or were
    refused with no admission limits asked for), 1 when a worker could not start or a
    scheduler got stuck, 2 on bad input (or more workers than the machine holds), 130 when
    interrupted. With ``--http``/``--worker-http`` it serves instead (``serve_fleet``)."""
    problem = _refused_options(args)
    names = ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold")
    args.settings = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    args.settings.update(args.router_arg)
    try:
        make_policy(args.router, **args.settings)
        args.admission = _admission(args)
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


def _router_arg(text: str) -> tuple[str, int | float | str]:
    """``KEY=VALUE`` as a policy setting: the value as an int, else a float, else text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    for kind in (int, float):
        try:
            return key.replace("-", "_"), kind(value)
        except ValueError:
            pass
    return key.replace("-", "_"), value
