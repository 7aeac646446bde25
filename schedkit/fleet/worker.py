"""One worker of a live fleet: a scheduler assembled from the wiring as DP rank ``r`` of
``N``, on the wall clock, taking requests on its own ``zmq_server`` endpoint and publishing
KV events (with replay) on its own loopback ports, all on free ports. With ``http`` settings
it also serves its own OpenAI-compatible front end (``schedkit serve --http``'s, a second client
of the same ``zmq_server``) on the address given, for a router outside the fleet.

It reports to the parent on a PUSH socket: ``{"rank", "ready": {...endpoints}}`` once built,
``{"rank", "stats": {...}}`` after it stopped (peak RSS, prefix-cache token counts, uptime),
or ``{"rank", "error": message}`` when it fails (``describe_error``: any exception), and
``{"rank", "beat": n}`` every ``heartbeat_interval`` seconds from a thread of its own, so that
the parent sees within a beat or two that it stopped answering (a hung or stopped process)
even while a long step runs. The router is a trusted client sized to the worker: the
``zmq_server``'s per-client waiting limits are set to the worker's whole capacity (the
fleet's per-worker admission limits when given, else the server's own totals), so the
limits meant for hostile clients never refuse the fleet's traffic. It stops on SIGTERM, on
its stop from the parent (its SUB subscribes to it before anything is built, and the parent
waits for that subscription: ``schedkit.fleet.stop_channel``), or when its parent process is
gone, then finishes what is in flight for ``grace`` seconds and aborts the rest, as
``schedkit serve`` does. On a main thread it ignores SIGINT (Ctrl-C is the parent's) until it
returns, and restores both handlers then.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import signal
import threading
import time
import traceback
from collections.abc import Iterator

import attrs
import msgspec
import zmq

from schedkit.assembly.container import build
from schedkit.assembly.wiring import Ref, Wiring, WiringError
from schedkit.fleet.offline import worker_wiring
from schedkit.fleet.pool import pool_pages
from schedkit.http.launcher import front_end_overlay
from schedkit.logs import logs_to_stderr
from schedkit.serving import drain
from schedkit.sim.driver import peak_rss_mb

__all__ = [
    "WorkerSpec",
    "connect_stop",
    "describe_error",
    "serve_overlay",
    "stop_topic",
    "trusted_client_overlay",
    "worker_main",
]

LOOPBACK_ANY_PORT = "tcp://127.0.0.1:0"


@attrs.frozen
class WorkerSpec:
    """What a worker process needs (picklable, for the spawn context and Ray)."""

    file: str
    overlays: tuple
    rank: int
    num_workers: int
    report_endpoint: str
    stop_endpoint: str
    parent_pid: int | None = None
    grace: float = 2.0
    heartbeat_interval: float = 0.2
    max_requests: int | None = None
    max_tokens: int | None = None
    # The worker's own HTTP front end: the http_server's settings (address, keys, limits).
    http: dict | None = None
    # The token its zmq_server wants on pause, continue and flush (None: it takes none).
    admin_token: str | None = attrs.field(default=None, repr=False)


def serve_overlay() -> dict:
    """Requests and outputs on one ``zmq_server`` on a free loopback port; the wall clock."""
    return {
        "components": {
            "request_receiver": {"type": "zmq_server", "args": {"endpoint": LOOPBACK_ANY_PORT}},
            "output_sender": None,
            "output_streamer": {"args": {"sender": Ref("ref", "request_receiver")}},
            "model_runner": {"args": {"clock": "wall"}},
        }
    }


def trusted_client_overlay(
    wiring: Wiring, max_requests: int | None, max_tokens: int | None
) -> dict:
    """Waiting limits on the ``request_receiver`` (a ``zmq_server``) for a fleet worker: its
    totals are ``max_requests`` requests and ``max_tokens`` prompt tokens (None: the wiring's
    own totals), and the per-client limits (and the tokens released to the scheduler per
    client turn) equal them, since its one client is the router."""
    spec = wiring.components["request_receiver"]
    defaults = {f.name: f.default for f in attrs.fields(spec.cls)} if spec.cls else {}

    def total(name: str, given: int | None) -> int:
        return given if given is not None else spec.args.get(name, defaults[name])

    requests = total("max_waiting_requests", max_requests)
    tokens = total("max_waiting_tokens", max_tokens)
    limits = {
        "max_waiting_requests": requests,
        "max_waiting_requests_per_client": requests,
        "max_waiting_tokens": tokens,
        "max_waiting_tokens_per_client": tokens,
    }
    if "release_tokens_per_client" in defaults:
        # Fair turns between clients are moot with one client: the scheduler's waiting queue
        # sees all the router sent, as a scheduler behind a gateway does.
        limits["release_tokens_per_client"] = tokens
    return {"components": {"request_receiver": {"args": limits}}}


def describe_error(exc: BaseException) -> str:
    """What a worker tells its parent of an exception: a wiring error's problems (each names
    its ``FILE:LINE``), or any other exception's type, message and where it was raised."""
    if isinstance(exc, WiringError):
        return "; ".join(exc.errors)
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def stop_topic(rank: int) -> bytes:
    """What the parent sends worker ``rank`` to stop it: the one topic its stop SUB takes (the
    newline keeps rank 1's topic from being a prefix of rank 10's)."""
    return b"stop %d\n" % rank


def connect_stop(context: zmq.Context, spec: WorkerSpec) -> zmq.Socket:
    """A SUB taking this worker's stop from the parent's XPUB. The parent receives the
    subscription, so it knows when a stop sent to this worker will arrive, and counts the worker
    ready only once it has both the ready report and the subscription."""
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, stop_topic(spec.rank))
    sub.connect(spec.stop_endpoint)
    return sub


def _watch_stop(sub: zmq.Socket, spec: WorkerSpec, stop: threading.Event) -> None:
    """Set ``stop`` on a message on ``sub``, or when the parent process is gone; close ``sub``
    once ``stop`` is set."""
    try:
        while not stop.is_set():
            if sub.poll(200) or (spec.parent_pid is not None and os.getppid() != spec.parent_pid):
                stop.set()
    finally:
        sub.close(linger=0)


def _beat(context: zmq.Context, spec: WorkerSpec, stop: threading.Event) -> None:
    """Send ``{"rank", "beat": n}`` to the parent every ``heartbeat_interval`` seconds."""
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 16)  # a parent that does not read needs no backlog of beats
    push.connect(spec.report_endpoint)
    send = msgspec.msgpack.Encoder().encode
    try:
        for n in itertools.count():
            with contextlib.suppress(zmq.Again):
                push.send(send({"rank": spec.rank, "beat": n}), zmq.NOBLOCK)
            if stop.wait(spec.heartbeat_interval):
                return
    finally:
        push.close(linger=0)


def worker_main(spec: WorkerSpec) -> None:
    """Build, serve until told to stop, drain, report (see the module docstring)."""
    # A spawned process starts with structlog's defaults: logs go to stderr, as in the parent,
    # so that the parent's stdout carries only its summary; a worker run in a thread leaves the
    # caller's logging setup as it found it.
    stop = threading.Event()
    with logs_to_stderr(), _signals_stop(stop):
        _serve(spec, stop)


@contextlib.contextmanager
def _signals_stop(stop: threading.Event) -> Iterator[None]:
    """On the main thread: SIGTERM sets ``stop`` and SIGINT is ignored (Ctrl-C is the parent's
    to handle) until the worker returns; both handlers are restored then. Off the main thread
    (a Ray actor's call, a test's thread) no handler can be set and nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def _serve(spec: WorkerSpec, stop: threading.Event) -> None:
    context = zmq.Context()
    report = context.socket(zmq.PUSH)
    report.connect(spec.report_endpoint)
    send = msgspec.msgpack.Encoder().encode
    # Listening for the stop before anything else: a stop sent once the parent saw this
    # worker ready (or while it builds, should the parent give up) is never lost.
    watcher = threading.Thread(
        target=_watch_stop, args=(connect_stop(context, spec), spec, stop), name="fleet-stop"
    )
    watcher.start()
    beats = threading.Thread(target=_beat, args=(context, spec, stop), name="fleet-beat")
    events = {
        "publisher": "zmq",
        "mode": "bind",
        "endpoint": LOOPBACK_ANY_PORT,
        "replay_endpoint": LOOPBACK_ANY_PORT,
    }
    try:
        overlays = [*spec.overlays, serve_overlay()]
        token = spec.admin_token or secrets.token_urlsafe(24)
        if spec.http is not None:
            model = spec.http.get("model_name", "schedkit-sim")
            overlays.append(front_end_overlay(spec.http, token, model))
        elif spec.admin_token is not None:
            receiver = {"request_receiver": {"args": {"admin_token": token}}}
            overlays.append({"components": receiver})
        wiring = worker_wiring(spec.file, overlays, spec.rank, spec.num_workers, events)
        trusted = trusted_client_overlay(wiring, spec.max_requests, spec.max_tokens)
        overlays.append(trusted)
        wiring = worker_wiring(spec.file, overlays, spec.rank, spec.num_workers, events)
        with build(wiring) as assembly:
            started = time.monotonic()
            publisher = None
            scheduler = assembly["scheduler"]
            if "kv_events_publisher" in assembly:
                publisher = assembly["kv_events_publisher"]
            enabled = publisher is not None and publisher.enabled
            ready = {
                "pid": os.getpid(),
                "requests": assembly["request_receiver"].bound_endpoint,
                "kv_events": publisher.endpoint if enabled else None,
                "replay": publisher.replay_endpoint if enabled else None,
                "page_size": publisher.page_size if enabled else None,
                "pool_pages": pool_pages(assembly, publisher) if enabled else None,
                "topic": publisher.kv_events_config.topic if enabled else "",
                "profile": publisher.kv_events_config.profile if enabled else "sglang",
                "http": assembly["http_server"].url if "http_server" in assembly else None,
                "http_pid": assembly["http_server"].pid if "http_server" in assembly else None,
                "vocab_size": getattr(assembly["model_runner"], "vocab_size", None),
                "eos_token_id": getattr(assembly["model_runner"], "eos_token_id", None),
            }
            report.send(send({"rank": spec.rank, "ready": ready}))
            beats.start()
            assembly["scheduler"].serve(stop)
            drain(assembly, spec.grace)
            stats = {
                "peak_rss_mb": peak_rss_mb(),
                "uptime_seconds": time.monotonic() - started,
                "cached_tokens": scheduler.prefill_tokens_cached,
                "computed_tokens": scheduler.prefill_tokens_computed,
            }
        report.send(send({"rank": spec.rank, "stats": stats}))
    except Exception as exc:
        report.send(send({"rank": spec.rank, "error": describe_error(exc)}))
        if not isinstance(exc, WiringError):  # not the wiring's fault: the stack to stderr
            traceback.print_exc()
    finally:
        stop.set()  # the threads close their sockets within a poll of it
        watcher.join()
        if beats.is_alive():
            beats.join()
        with contextlib.suppress(zmq.ZMQError):
            report.close(linger=2000)
        context.term()
