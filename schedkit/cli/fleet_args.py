"""``schedkit fleet``'s options: the workers, the routing policy and its settings, live or
offline, the replay loop, admission control and the outputs; and what the options ask for
together (the admission limits, the combinations refused)."""

from __future__ import annotations

import argparse

from schedkit.cli.args import add_wiring_args, number
from schedkit.cli.fleet_serve import add_fleet_http_args, serves
from schedkit.cli.workload_args import add_summary_args, add_workload_args
from schedkit.fleet.admission import AdmissionLimits, QueueLimits
from schedkit.fleet.live import LAUNCHERS
from schedkit.router import POLICIES

__all__ = ["add_fleet_args", "admission_limits", "refused_options"]


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    """Add every option of ``schedkit fleet`` to ``p``."""
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


def admission_limits(args: argparse.Namespace) -> AdmissionLimits:
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


def refused_options(args: argparse.Namespace) -> str | None:
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
