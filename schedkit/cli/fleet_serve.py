"""``schedkit fleet --http HOST:PORT`` and ``--worker-http``: a live fleet served over HTTP until
SIGINT or SIGTERM instead of driven by a workload.

``--http``: the fleet's router itself is one OpenAI-compatible endpoint, the front end of
``schedkit serve --http`` (same routes, keys, limits and error bodies) in front of a
``FleetGateway`` on a private ipc:// path, which routes each request by ``--router`` over the
live KV-event index; ``/metrics`` there gives the router's figures (``gateway_metrics``).
``--worker-http``: each worker also serves its own front end, for a router outside the fleet.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from schedkit.cli.args import wiring_sources
from schedkit.cli.http_args import add_http_args, http_server_args
from schedkit.fleet.capacity import FleetCapacityError
from schedkit.fleet.gateway import FleetGateway
from schedkit.fleet.gateway_metrics import GatewayMetrics
from schedkit.fleet.launch import WorkerStartError
from schedkit.http.config import Limits, parse_address
from schedkit.http.launcher import HttpServer

__all__ = ["add_fleet_http_args", "serve_fleet", "serves"]

# Front-end limits on what it hands over, scaled by the number of workers unless given.
_PER_WORKER_LIMITS = (
    "max_forwarded_requests",
    "max_forwarded_tokens",
    "max_forwarded_per_key",
    "max_scheduler_waiting",
    "max_scheduler_waiting_tokens",
)
# Options that shape a workload run, meaningless while serving.
_RUN_ONLY = {
    "workload": "--workload",
    "speedup": "--speedup",
    "num_requests": "--num-requests",
    "rate": "--rate",
    "concurrency": "--concurrency",
    "output": "--output",
    "plot": "--plot",
    "format": "--format",
    "trace_block_size": "--trace-block-size",
}


def _worker_base(text: str) -> str:
    """``auto`` (a free port each), ``PORT`` or ``HOST:PORT`` (worker r on PORT + r)."""
    if text == "auto":
        return "127.0.0.1:0"
    try:
        parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or auto") from None
    return text


def add_fleet_http_args(p: argparse.ArgumentParser) -> None:
    """``--http``, ``--worker-http``, ``--endpoints-file`` and the front end's options."""
    g = add_http_args(
        p,
        "serve the fleet's router as one OpenAI-compatible endpoint here (port 0: a free one) "
        "until SIGINT/SIGTERM, instead of running a workload",
    )
    g.add_argument(
        "--worker-http",
        metavar="PORT|HOST:PORT|auto",
        type=_worker_base,
        help="give each worker its own HTTP front end, worker r on PORT + r (auto: free ports), "
        "for a router outside the fleet; serves until SIGINT/SIGTERM",
    )
    g.add_argument(
        "--endpoints-file",
        metavar="FILE.json",
        help="with --http/--worker-http: write the endpoints (front end, each worker's HTTP, "
        "KV events and replay) here once ready, as printed on stdout",
    )


def serves(args: argparse.Namespace) -> bool:
    """True when the options ask for serving instead of a workload run."""
    return args.http is not None or args.worker_http is not None


def _refused(args: argparse.Namespace) -> str | None:
    if args.offline:
        return "--http and --worker-http serve live workers; leave out --offline"
    given = [flag for name, flag in _RUN_ONLY.items() if getattr(args, name, None) is not None]
    if args.json:
        given.append("--json")
    if given:
        return f"{', '.join(given)} shape a workload run; --http/--worker-http serve instead"
    return None


def serve_fleet(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM: 0 then, 1 when a worker or the front end could not start
    or the front end stopped by itself, 2 on bad options."""
    problem = _refused(args)
    if problem is not None:
        print(f"schedkit fleet: {problem}", file=sys.stderr)
        return 2
    http_args = http_server_args(args, "fleet")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with tempfile.TemporaryDirectory(prefix="schedkit-fleet-") as private:
        try:
            return _serve(args, http_args, Path(private), stop)
        except (WorkerStartError, ValueError) as exc:
            print(f"schedkit fleet: {exc}", file=sys.stderr)
            return 1
        except FleetCapacityError as exc:
            print(f"schedkit fleet: {exc}", file=sys.stderr)
            return 2


def _serve(args: argparse.Namespace, http_args: dict, private: Path, stop: threading.Event) -> int:
    file, overlays = wiring_sources(args)
    worker_http = None
    if args.worker_http is not None:
        worker_http = {**http_args, "address": args.worker_http}
    gateway = FleetGateway(
        file,
        args.workers,
        args.router,
        endpoint=f"ipc://{private / 'router'}",
        overlays=overlays,
        settings=args.settings,
        launcher=args.launcher,
        heartbeat_timeout=args.heartbeat_timeout or 1.0,
        admission=args.admission,
        cap_workers=not args.no_worker_cap,
        worker_http=worker_http,
    )
    front_end = metrics = None
    status = 0
    try:
        print(f"schedkit fleet: starting {args.workers} workers ...", file=sys.stderr, flush=True)
        gateway.start()
        if args.http is not None:
            metrics = GatewayMetrics(gateway)
            front_end = _front_end(args, http_args, gateway, metrics.port)
        _announce(args, gateway, front_end)

        def stopped() -> bool:
            return stop.is_set() or (front_end is not None and front_end.exited)

        if not stop.is_set():
            gateway.serve(stopped)
        if front_end is not None and front_end.exited and not stop.is_set():
            print("schedkit fleet: the HTTP front end stopped by itself", file=sys.stderr)
            status = 1
    finally:
        if front_end is not None:
            front_end.close()
        if metrics is not None:
            metrics.close()
        gateway.close()
    for rank, why in sorted(gateway.deaths.items()):
        print(f"schedkit fleet: worker {rank} was taken out: {why}", file=sys.stderr)
    print("schedkit fleet: stopped", file=sys.stderr)
    return status


def _front_end(
    args: argparse.Namespace, http_args: dict, gateway: FleetGateway, metrics_port: int
) -> HttpServer:
    """The HTTP front end of ``schedkit serve --http``, connected to the gateway."""
    limits = dict(http_args["limits"])
    defaults = Limits()
    for name in _PER_WORKER_LIMITS:
        limits.setdefault(name, getattr(defaults, name) * args.workers)
    first = gateway.endpoints[0]
    return HttpServer(
        **{**http_args, "limits": limits},
        address=args.http,
        scheduler_endpoint=gateway.bound_endpoint,
        metrics_port=metrics_port,
        vocab_size=first["vocab_size"],
        eos_token_id=first["eos_token_id"],
    )


def _announce(
    args: argparse.Namespace,
    gateway: FleetGateway,
    front_end: HttpServer | None,
) -> None:
    """The endpoints as one JSON line on stdout (and in ``--endpoints-file``)."""
    workers = []
    for rank in range(gateway.num_workers):
        ready = gateway.endpoints[rank]
        workers.append(
            {
                "rank": rank,
                "pid": ready["pid"],
                "http": ready.get("http"),
                "kv_events": ready["kv_events"],
                "replay": ready["replay"],
            }
        )
    endpoints = {
        "http": front_end.url if front_end is not None else None,
        "router": args.router if front_end is not None else None,
        "workers": workers,
    }
    if args.endpoints_file:
        path = Path(args.endpoints_file)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(json.dumps(endpoints, indent=2) + "\n")
        os.replace(partial, path)
    print(json.dumps({"ready": endpoints}), flush=True)
    for worker in workers:
        if worker["http"]:
            print(f"schedkit fleet: worker {worker['rank']} at {worker['http']}", file=sys.stderr)
    if front_end is not None:
        print(f"schedkit fleet: serving {front_end.url} (router {args.router})", file=sys.stderr)
