"""``schedkit run`` (a workload through an assembled scheduler, then a summary) and
``schedkit serve`` (take requests on the receiver's endpoint until SIGINT/SIGTERM)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import msgspec
import structlog

from schedkit.assembly.container import Assembly, ComponentBuildError, build
from schedkit.assembly.loading import load_wiring
from schedkit.assembly.wiring import Wiring
from schedkit.cli.args import (
    add_wiring_args,
    number,
    run_provenance,
    wiring_from_args,
    wiring_sources,
)
from schedkit.cli.files import output_problem
from schedkit.cli.http_args import add_serve_http_args, http_overlays
from schedkit.cli.workload_args import (
    add_summary_args,
    add_workload_args,
    progress_display,
    workload_from_args,
)
from schedkit.core.schedule_batch import Req
from schedkit.kv_events import KvEventsConfig
from schedkit.serving import drain
from schedkit.sim.driver import StuckError, drive
from schedkit.sim.plot import PlotError, check_plot_target, plot_run
from schedkit.workloads.samples import Tally

__all__ = ["add_parsers"]

log = structlog.get_logger("schedkit.serve")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the ``run`` and ``serve`` sub-commands."""
    p = sub.add_parser("run", help="run a workload through the scheduler and print a summary")
    add_wiring_args(p)
    add_workload_args(p)
    add_summary_args(p)
    p.add_argument(
        "--output",
        metavar="FILE.jsonl",
        help="write one JSON record per finished request (rid, tokens, ttft, latency, finish)",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw latency CDFs (TTFT, ITL, E2E) and running/queued requests over simulated "
        "time into FILE (needs the plot extra: pip install 'schedkit[plot]')",
    )
    p.add_argument(
        "--kv-events-linger",
        type=number(float, allow_minimum=True),
        default=0.0,
        metavar="SECONDS",
        help="keep the KV-event stream and its replay socket up this long after the run, so "
        "that a router can catch up (Ctrl-C ends it early)",
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
    p.add_argument(
        "--admin-token",
        default=os.environ.get("SCHEDKIT_ADMIN_TOKEN"),
        metavar="TOKEN",
        help="the token a client's pause, continue and flush messages must carry (default: "
        "$SCHEDKIT_ADMIN_TOKEN, which stays out of the process list); without one they are "
        "refused",
    )
    add_serve_http_args(p)
    p.set_defaults(run=cmd_serve)


def _record(out: TextIO) -> Callable[[Req], None]:
    """Write one JSON line per finished request to ``out``."""
    encode = msgspec.json.Encoder().encode

    def write(req: Req) -> None:
        first = req.first_token_time
        record = {
            "rid": req.rid,
            "arrival": req.arrival_time,
            "prompt_tokens": len(req.origin_input_ids),
            "output_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "ttft": None if first is None else first - req.arrival_time,
            "latency": None if req.finish_time is None else req.finish_time - req.arrival_time,
            "finish": msgspec.to_builtins(req.finished_reason),
        }
        out.write(encode(record).decode() + "\n")

    return write


# What writing --output can fail with once it is open (the disk filled up, a quota).
_WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG)


def cmd_run(args: argparse.Namespace) -> int:
    """``schedkit run``: 0 after the summary, 1 when the scheduler got stuck, 2 on bad input,
    130 when interrupted."""
    samples = None
    problem = args.output and output_problem(args.output, overwrite=True)
    if problem:
        print(f"schedkit run: {problem}", file=sys.stderr)
        return 2
    if args.plot:
        try:
            check_plot_target(args.plot)
        except PlotError as exc:
            print(f"schedkit run: --plot: {exc}", file=sys.stderr)
            return 2
        samples = Tally()
    wiring = wiring_from_args(args)
    loaded = workload_from_args(args, "run")
    if loaded is None:
        return 2
    workload, total = loaded
    with _build_on_free_kv_ports(wiring, lambda free: wiring_from_args(args, free)) as assembly:
        publisher = None
        if "kv_events_publisher" in assembly:
            publisher = assembly["kv_events_publisher"]
        if publisher is not None and publisher.endpoint is not None:
            replay = publisher.replay_endpoint
            print(
                f"schedkit run: KV events on {publisher.endpoint}"
                + (f", replay on {replay}" if replay else ""),
                file=sys.stderr,
            )
        try:
            with contextlib.ExitStack() as stack:
                out = None
                if args.output:
                    out = stack.enter_context(open(args.output, "w", encoding="utf-8"))
                show = stack.enter_context(progress_display(args, total))
                try:
                    summary = drive(
                        assembly,
                        workload,
                        progress=show,
                        on_finish=None if out is None else _record(out),
                        samples=samples,
                    )
                except StuckError as exc:
                    print(f"\nschedkit run: {exc}", file=sys.stderr)
                    return 1
        except OSError as exc:
            if not args.output or exc.errno not in _WRITE_ERRORS:
                raise
            print(f"schedkit run: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
            return 2
        if args.kv_events_linger and publisher is not None and publisher.endpoint is not None:
            _linger(publisher, args.kv_events_linger)
    if samples is not None:
        plot_run(samples, args.plot)
        print(f"schedkit run: plot written to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps({"run": run_provenance(args), **summary.to_dict()}))
    else:
        print(summary.table())
    return 130 if summary.interrupted else 0


def _build_on_free_kv_ports(
    wiring: Wiring, with_overlay: Callable[[dict], Wiring], command: str = "run"
) -> Assembly:
    """Build ``wiring``; when a KV-event endpoint's tcp port is taken (another scheduler runs
    there), build ``with_overlay(overlay)`` (the same wiring with one more overlay) with its
    KV-event endpoints on free ports (port 0, which the bind resolves). The bind itself is the
    test, so two schedulers started together cannot both take a port found free."""
    try:
        return build(wiring)
    except ComponentBuildError as exc:
        free = _free_kv_ports_overlay(wiring, exc.__cause__)
        if free is None:
            raise
        taken, overlay = free
        print(f"schedkit {command}: {taken} in use; KV events move to free ports", file=sys.stderr)
        return build(with_overlay(overlay))


def _free_kv_ports_overlay(wiring: Wiring, error: BaseException | None) -> tuple[str, dict] | None:
    """(the taken endpoint, an overlay moving its component's tcp KV-event endpoints to port
    0) when ``error`` is a KV-event bind that found its address in use; else None."""
    if not isinstance(error, OSError) or error.errno != errno.EADDRINUSE:
        return None
    for name, spec in wiring.components.items():
        config = spec.args.get("kv_events_config")
        if not isinstance(config, KvEventsConfig) or config.mode != "bind":
            continue
        endpoints = {"endpoint": config.endpoint, "replay_endpoint": config.replay_endpoint}
        tcp = {k: v for k, v in endpoints.items() if v is not None and v.startswith("tcp://")}
        taken = [v for v in tcp.values() if f"bind to {v}:" in str(error)]
        if taken:
            free = msgspec.structs.asdict(config)
            free.update({k: f"{v.rpartition(':')[0]}:0" for k, v in tcp.items()})
            return taken[0], {"components": {name: {"args": {"kv_events_config": free}}}}
    return None


def _linger(publisher: Any, seconds: float) -> None:
    """Keep the KV-event stream and replay up for ``seconds`` after publishing the rest."""
    publisher.publish_kv_events()
    publisher.flush()
    print(
        f"schedkit run: KV events stay up for {seconds:g} s ({publisher.accepted} batches)",
        file=sys.stderr,
    )
    with contextlib.suppress(KeyboardInterrupt):
        time.sleep(seconds)


def cmd_serve(args: argparse.Namespace) -> int:
    """``schedkit serve``: serve until SIGINT or SIGTERM, then drain for ``--grace`` seconds."""
    with tempfile.TemporaryDirectory(prefix="schedkit-serve-") as private:
        return _serve(args, Path(private))


def _serve(args: argparse.Namespace, private_dir: Path) -> int:
    file, overlays = wiring_sources(args)
    front_end = http_overlays(args, private_dir, lambda: load_wiring(file, *overlays))
    wiring = load_wiring(file, *overlays, *front_end)
    extra = []
    if args.admin_token:
        receiver = wiring.components.get("request_receiver")
        if receiver is None or receiver.type != "zmq_server":
            print(
                "schedkit serve: --admin-token needs a zmq_server request_receiver "
                "(the shipped serve overlay: -o serve)",
                file=sys.stderr,
            )
            return 2
        extra.append(
            {"components": {"request_receiver": {"args": {"admin_token": args.admin_token}}}}
        )
    if extra:
        wiring = load_wiring(file, *overlays, *front_end, *extra)
    stop = threading.Event()
    with _build_on_free_kv_ports(
        wiring, lambda free: load_wiring(file, *overlays, *front_end, *extra, free), "serve"
    ) as assembly:
        if getattr(assembly["request_receiver"], "bound_endpoint", None) is None:
            print(
                "schedkit serve: the wiring's request_receiver takes no network requests; add "
                "the shipped serve overlay (a zmq_server, the wall clock): schedkit serve "
                f"{args.file or ''} -o serve".replace("  ", " "),
                file=sys.stderr,
            )
            return 2
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        # What the build made lives as long as the server: out of the collector's generations,
        # a full collection while serving walks only what requests made.
        gc.collect()
        gc.freeze()
        _announce(assembly)
        assembly["scheduler"].serve(stop)
        drain(assembly, args.grace)
    log.info("schedkit serve stopped")
    return 0


def _announce(assembly: Assembly) -> None:
    endpoints = {"requests": getattr(assembly["request_receiver"], "bound_endpoint", None)}
    if "output_sender" in assembly:
        endpoints["outputs"] = getattr(assembly["output_sender"], "bound_endpoint", None)
    if "kv_events_publisher" in assembly:
        endpoints["kv_events"] = getattr(assembly["kv_events_publisher"], "endpoint", None)
    if "http_server" in assembly:
        endpoints["http"] = assembly["http_server"].url
    log.info("schedkit serve ready", **{k: v for k, v in endpoints.items() if v})
    print(json.dumps({"ready": endpoints}), flush=True)
