"""``schedkit serve --http HOST:PORT``: the options of the HTTP front end and the wiring overlay
that adds it (an internal ZeroMQ edge on a private ipc path, metrics on, the wall clock)."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

import attrs

from schedkit.assembly.wiring import Wiring
from schedkit.cli.args import number
from schedkit.cli.http_step_bound import parse_prefill_step, prefill_step_overlay
from schedkit.http.config import Limits, parse_address
from schedkit.http.launcher import HttpServer, front_end_overlay

__all__ = [
    "add_http_args",
    "add_serve_http_args",
    "http_limits",
    "http_overlays",
    "http_server_args",
]

_RECEIVER_OVERLAY = """\
components:
  request_receiver:
    type: zmq_server
    args:
      endpoint: {endpoint}
  output_sender: null
  output_streamer:
    args:
      sender: !ref request_receiver
  model_runner:
    args:
      clock: wall
  scheduler:
    args:
      client_of: !call request_receiver.client_of
"""


def _address(text: str) -> str:
    try:
        parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


_SERVE_HTTP_HELP = (
    "serve OpenAI-compatible and SGLang-native HTTP routes here (port 0: a free one); the "
    "ZeroMQ edge then moves to a private ipc:// path"
)


def add_http_args(
    p: argparse.ArgumentParser, http_help: str = _SERVE_HTTP_HELP
) -> argparse._ArgumentGroup:
    """The front end's options (on ``schedkit serve``, and ``schedkit fleet``'s with its own
    ``--http`` help); returns their group."""
    g = p.add_argument_group("HTTP front end (docs/http.md)")
    g.add_argument("--http", metavar="HOST:PORT", type=_address, help=http_help)
    g.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="require Authorization: Bearer KEY on every route; repeatable (one key per user: "
        "admission is fair between keys); also $SCHEDKIT_API_KEY",
    )
    g.add_argument(
        "--admin-api-key",
        default=os.environ.get("SCHEDKIT_ADMIN_API_KEY") or None,
        help="key for pause/continue/flush and for aborting other keys' requests "
        "(default: $SCHEDKIT_ADMIN_API_KEY)",
    )
    g.add_argument("--tokenizer", metavar="FILE", help="a Hugging Face tokenizer.json")
    g.add_argument("--served-model-name", default="schedkit-sim")
    g.add_argument("--context-length", type=number(int, minimum=2, allow_minimum=True))
    g.add_argument(
        "--http-allow-remote",
        action="store_true",
        help="allow --http on a non-loopback address",
    )
    g.add_argument(
        "--http-limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"a front-end limit ({', '.join(Limits.__struct_fields__)}); repeatable",
    )
    return g


def add_serve_http_args(p: argparse.ArgumentParser) -> None:
    """``schedkit serve``'s front-end options: ``add_http_args`` and the prefill step bound."""
    g = add_http_args(p)
    g.add_argument(
        "--http-prefill-step",
        type=parse_prefill_step,
        default="auto",
        metavar="auto|off|MS",
        help="bound a prefill step's modelled time, so that a step in progress holds another "
        "key's request up little: auto (default) two decode steps at idle by the model "
        "runner's cost model, or MS milliseconds; off: the wiring's token bounds only",
    )


def http_limits(args: argparse.Namespace, command: str) -> dict[str, int | float]:
    """The ``--http-limit NAME=VALUE`` options as a dict; SystemExit naming a bad one."""
    limits: dict[str, int | float] = {}
    for item in args.http_limit:
        name, sep, value = item.partition("=")
        if not sep or name not in Limits.__struct_fields__:
            raise SystemExit(
                f"schedkit {command}: --http-limit {item!r}: expected NAME=VALUE with NAME one "
                f"of {', '.join(Limits.__struct_fields__)}"
            )
        try:
            limits[name] = _number(value)
        except ValueError:
            raise SystemExit(f"schedkit {command}: --http-limit {item!r}: not a number") from None
    return limits


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def http_server_args(args: argparse.Namespace, command: str) -> dict:
    """The ``http_server`` settings the options give (keys, tokenizer, model, limits); the
    address is left to the caller."""
    http_args: dict = {
        "api_keys": [*args.api_key, *filter(None, [os.environ.get("SCHEDKIT_API_KEY")])],
        "admin_api_key": args.admin_api_key,
        "tokenizer_path": args.tokenizer,
        "model_name": args.served_model_name,
        "allow_remote": args.http_allow_remote,
        "limits": http_limits(args, command),
    }
    if args.context_length is not None:
        http_args["context_length"] = args.context_length
    return http_args


def http_overlays(
    args: argparse.Namespace, private_dir: Path, base: Callable[[], Wiring]
) -> list[str | Path | dict]:
    """The overlays that add the front end to the wiring ``base`` loads (empty without
    ``--http``): the internal edge, the front end, and the prefill step bound."""
    if args.http is None:
        return []
    overlay = private_dir / "http.yaml"
    overlay.write_text(_RECEIVER_OVERLAY.format(endpoint=f"ipc://{private_dir / 'scheduler'}"))
    # The front end pauses, continues and flushes through the scheduler's ZeroMQ edge, which
    # takes those only with its admin token: --admin-token's, or one made for this run.
    token = args.admin_token or secrets.token_urlsafe(24)
    http_args = {
        "address": args.http,
        **http_server_args(args, "serve"),
        "scheduler_shares_keys": True,  # client_of above
    }
    # The front end is the internal edge's one client and keeps its own (per-key) bounds on
    # what waits in the scheduler: the edge releases all it forwards. At the edge's default
    # (16,384 prompt tokens unadmitted per client) a flood's long prompt waiting behind the
    # one being prefilled held another key's small request at the edge until it was admitted.
    forwarded = Limits(**http_args["limits"]).max_forwarded_tokens
    release = {
        "components": {"request_receiver": {"args": {"release_tokens_per_client": forwarded}}}
    }
    overlays: list[str | Path | dict] = [
        overlay,
        front_end_overlay(http_args, token, args.served_model_name),
        release,
    ]
    context = http_args.get("context_length", attrs.fields(HttpServer).context_length.default)
    step, line = prefill_step_overlay(args.http_prefill_step, base(), context)
    print(f"schedkit serve: {line}", file=sys.stderr)
    if step is not None:
        overlays.append(step)
    return overlays
