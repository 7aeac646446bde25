"""The worker processes of a live fleet: starting them on free loopback ports, waiting until
each is ready, following their heartbeats, taking one out, and stopping them all.

Each worker (``schedkit.fleet.worker``) is its own process (multiprocessing spawn context,
or a Ray actor with ``launcher="ray"``). ``LiveWorkers`` holds one DEALER connected to each
worker's ``zmq_server``, the PULL socket they report to (ready, beats, final figures) and the
``StopChannel`` that tells them to stop (a worker is ready once it has reported ready and
subscribed to its stop); ``schedkit.fleet.live.LiveFleet`` routes requests over them.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog
import zmq

from schedkit.fleet.capacity import check_live_workers
from schedkit.fleet.launch import LAUNCHERS, WorkerStartError, exit_reason
from schedkit.fleet.stop_channel import StopChannel
from schedkit.fleet.worker import LOOPBACK_ANY_PORT, WorkerSpec
from schedkit.http.config import parse_address

__all__ = ["LiveWorkers"]

log = structlog.get_logger("schedkit.fleet.live")


def _bind(context: zmq.Context, kind: int) -> tuple[zmq.Socket, str]:
    sock = context.socket(kind)
    sock.bind(LOOPBACK_ANY_PORT)
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def _stop_front_end(pid: int | None) -> None:
    """Stop the HTTP front end of a worker that did not stop it itself (it was killed)."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and _running(pid):
            time.sleep(0.05)
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class LiveWorkers:
    """``num_workers`` worker processes built from ``file`` (+ ``overlays``): ``start()``
    (or ``with``), ``close()``. A worker sends a beat every ``heartbeat_interval`` seconds;
    ``max_requests``/``max_tokens`` are its waiting limits (None: its wiring's). With
    ``cap_workers``, ``FleetCapacityError`` when this machine cannot hold them. With
    ``worker_http`` (``http_server`` settings; ``address`` the base: worker ``r`` listens on
    its port + ``r``, or on a free one with port 0) each worker serves its own HTTP front
    end; its URL is in ``endpoints[r]["http"]``."""

    def __init__(
        self,
        file: str | os.PathLike,
        num_workers: int,
        *,
        overlays: Sequence[str | os.PathLike | Mapping] = (),
        launcher: str = "process",
        heartbeat_interval: float = 0.2,
        heartbeat_timeout: float = 1.0,
        ready_timeout: float = 120.0,
        grace: float = 2.0,
        max_requests: int | None = None,
        max_tokens: int | None = None,
        cap_workers: bool = True,
        worker_http: Mapping | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"a fleet needs at least one worker, got {num_workers}")
        if cap_workers:
            check_live_workers(num_workers)
        if launcher not in LAUNCHERS:
            raise ValueError(f"unknown launcher {launcher!r}; valid: {', '.join(LAUNCHERS)}")
        # Absolute paths: a worker may run in another working directory (a Ray actor).
        self.file, self.num_workers = str(Path(file).resolve()), num_workers
        self.overlays = tuple(
            o if isinstance(o, Mapping) else str(Path(o).resolve()) for o in overlays
        )
        self.launcher = launcher
        self.startup_seconds = math.nan  # launching the workers until all were ready
        self.heartbeat_interval, self.heartbeat_timeout = heartbeat_interval, heartbeat_timeout
        self.ready_timeout, self.grace = ready_timeout, grace
        self.max_requests, self.max_tokens = max_requests, max_tokens
        self.worker_http = dict(worker_http) if worker_http is not None else None
        # What the workers' zmq_servers want on pause, continue and flush: only this router.
        self.admin_token = secrets.token_urlsafe(24)
        self.handles: list[Any] = []
        self.endpoints: dict[int, dict] = {}  # each worker's ready report: pid and endpoints
        self._launcher: Any = None
        self.alive = [True] * num_workers
        self.deaths: dict[int, str] = {}
        self.stats: dict[int, dict] = {}
        self._context = zmq.Context()
        self._report, self._report_endpoint = _bind(self._context, zmq.PULL)
        # A worker counts as ready only once a stop sent to it will reach it.
        self._stop = StopChannel(self._context, num_workers)
        self._failed_to_start: set[int] = set()  # workers that reported an error: no figures
        self._dealers: list[zmq.Socket] = []
        self._decode_report = msgspec.msgpack.Decoder(dict).decode
        self._poller = zmq.Poller()
        self._sentinels: dict[int, int] = {}
        self._last_seen = [0.0] * num_workers
        self._closed = False

    def __enter__(self) -> LiveWorkers:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Launch the workers, wait until each is ready and connect to them; on failure
        whatever started is stopped again."""
        started = time.monotonic()
        try:
            self._start()
            self.startup_seconds = time.monotonic() - started
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        self._start_workers()

    def _start_workers(self) -> dict[int, dict]:
        """Launch every worker, wait for their ready reports, connect a DEALER to each and
        poll its sentinel; returns the reports."""
        self._launcher = LAUNCHERS[self.launcher]()
        for rank in range(self.num_workers):
            spec = WorkerSpec(
                self.file,
                self.overlays,
                rank,
                self.num_workers,
                self._report_endpoint,
                self._stop.endpoint,
                parent_pid=os.getpid(),
                grace=self.grace,
                heartbeat_interval=self.heartbeat_interval,
                max_requests=self.max_requests,
                max_tokens=self.max_tokens,
                http=self._http_settings(rank),
                admin_token=self.admin_token,
            )
            self.handles.append(self._launcher.launch(spec))
        ready = self.endpoints = self._wait_ready()
        for rank in range(self.num_workers):
            dealer = self._context.socket(zmq.DEALER)
            dealer.connect(ready[rank]["requests"])
            self._dealers.append(dealer)
            self._poller.register(dealer, zmq.POLLIN)
            sentinel = self.handles[rank].sentinel  # readable once the worker has exited
            self._poller.register(sentinel, zmq.POLLIN)
            self._sentinels[sentinel] = rank
        return ready

    def _http_settings(self, rank: int) -> dict | None:
        """Worker ``rank``'s front-end settings: the base address's port plus ``rank`` (port
        0: a free one each)."""
        if self.worker_http is None:
            return None
        host, port = parse_address(self.worker_http["address"])
        address = f"[{host}]" if ":" in host else host
        return {**self.worker_http, "address": f"{address}:{port + rank if port else 0}"}

    def _wait_ready(self) -> dict[int, dict]:
        """Each worker's ready report, once every worker has sent one and subscribed to its
        stop."""
        ready: dict[int, dict] = {}
        deadline = time.monotonic() + self.ready_timeout
        poller = zmq.Poller()
        poller.register(self._report, zmq.POLLIN)
        poller.register(self._stop.socket, zmq.POLLIN)
        while len(ready) < self.num_workers or len(self._stop.subscribed) < self.num_workers:
            poller.poll(100)
            self._stop.take_subscriptions()
            while self._report.poll(0):
                self._take_ready(ready)
            gone = [r for r, h in enumerate(self.handles) if r not in ready and not h.is_alive()]
            if gone:
                while self._report.poll(500):  # the report it sent before exiting, if any
                    self._take_ready(ready)
                why = exit_reason(self.handles[gone[0]])
                raise WorkerStartError(f"worker {gone[0]} exited before it was ready ({why})")
            if time.monotonic() > deadline:
                raise WorkerStartError(f"workers not ready after {self.ready_timeout:g} s")
        now = time.monotonic()
        self._last_seen = [now] * self.num_workers
        return ready

    def _take_ready(self, ready: dict[int, dict]) -> None:
        """One start-up report: a worker's endpoints into ``ready``, or its error raised."""
        msg = self._decode_report(self._report.recv())
        if "error" in msg:
            self._failed_to_start.add(msg["rank"])
            raise WorkerStartError(f"worker {msg['rank']}: {msg['error']}")
        if "ready" in msg:  # else a beat of a worker that is ready already
            ready[msg["rank"]] = msg["ready"]

    def kill(self, rank: int) -> None:
        """Kill worker ``rank`` outright, its process or its Ray actor (as a crash would)."""
        self.handles[rank].kill()

    def _take_reports(self) -> None:
        """Beats (and a late error) from the workers' report sockets."""
        now = time.monotonic()
        while self._report.poll(0):
            try:
                msg = self._decode_report(self._report.recv())
                rank = msg["rank"]
                alive = self.alive[rank]
            except (msgspec.DecodeError, KeyError, IndexError, TypeError) as exc:
                log.warning("fleet.bad_report", error=str(exc)[:200])
                continue
            if not alive:
                continue
            if "error" in msg:
                self._mark_dead(rank, f"it failed: {msg['error']}")
            else:
                self._last_seen[rank] = max(self._last_seen[rank], now)

    def _mark_dead(self, rank: int, why: str) -> None:
        """Take worker ``rank`` out: its messages and exit are no longer watched."""
        self.alive[rank] = False
        self.deaths[rank] = why
        self._poller.unregister(self._dealers[rank])
        for sentinel in [fd for fd, owner in self._sentinels.items() if owner == rank]:
            self._poller.unregister(sentinel)
            del self._sentinels[sentinel]

    def close(self) -> None:
        """Stop the live workers (they drain for ``grace`` s), collect their final figures,
        kill what does not stop and close every socket. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._stop.stop_all()
        deadline = time.monotonic() + self.grace + 10.0
        pending = {
            r
            for r, h in enumerate(self.handles)
            if self.alive[r] and r not in self._failed_to_start and h.is_alive()
        }
        exited: dict[int, float] = {}
        poller = zmq.Poller()
        poller.register(self._report, zmq.POLLIN)
        poller.register(self._stop.socket, zmq.POLLIN)
        while pending and time.monotonic() < deadline:
            poller.poll(100)
            self._stop.take_subscriptions()  # a worker yet to subscribe: its stop goes now
            while pending and self._report.poll(0):
                msg = self._decode_report(self._report.recv())
                if "stats" in msg:
                    self.stats[msg["rank"]] = msg["stats"]
                    pending.discard(msg["rank"])
            now = time.monotonic()
            for rank in [r for r in pending if not self.handles[r].is_alive()]:
                if now - exited.setdefault(rank, now) > 1.0:  # its report would be here by now
                    pending.discard(rank)
        for rank, handle in enumerate(self.handles):
            clean = self.alive[rank]
            if clean:
                handle.join(timeout=5.0)
            if handle.is_alive():  # dead to the router (e.g. hung) or not stopping
                clean = False
                handle.kill()
                handle.join(timeout=5.0)
            if not clean or rank not in self.stats:
                _stop_front_end(self.endpoints.get(rank, {}).get("http_pid"))
        if self._launcher is not None:
            self._launcher.close()
        for sock in [*self._dealers, self._report]:
            sock.close(linger=0)
        self._stop.close()
        self._context.term()
