"""A real ``schedkit serve`` in a child process on free loopback ports, for end-to-end tests and
benchmarks of the request socket and the HTTP front end: ``start_serve()``,
``start_http_serve()``, ``stop_serve()``, ``free_endpoint()`` and ``peak_rss_mib(pid)``."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import IO

from schedkit import wirings
from schedkit.sim.run_summary import vm_hwm_mib

__all__ = ["free_endpoint", "peak_rss_mib", "start_http_serve", "start_serve", "stop_serve"]


def free_endpoint() -> str:
    """A tcp endpoint on 127.0.0.1 whose port was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def start_serve(
    *,
    stderr: int | IO[str] = subprocess.PIPE,
    admin_token: str | None = None,
    max_open_files: int | None = None,
    args: Sequence[str] = (),
) -> tuple[subprocess.Popen, str]:
    """``schedkit serve`` on the shipped default wiring with the ``serve`` overlay and ``args``
    (presets, more overlays), its request endpoint and KV events on free ports (``admin_token``
    for control messages; the process's descriptor limit lowered to ``max_open_files``);
    returns the process (text stdout, whose first line is the ready message) and the request
    endpoint."""
    endpoint = free_endpoint()
    env = {
        **os.environ,
        "SCHEDKIT_REQUEST_ENDPOINT": endpoint,
        "SCHEDKIT_KV_EVENTS_ENDPOINT": free_endpoint(),
        "SCHEDKIT_KV_REPLAY_ENDPOINT": free_endpoint(),
    }
    if admin_token is not None:
        env["SCHEDKIT_ADMIN_TOKEN"] = admin_token
    command = [sys.executable, "-m", "schedkit.cli", "serve", str(wirings.path())]
    limit = None
    if max_open_files is not None:

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_open_files, max_open_files))

    server = subprocess.Popen(
        [*command, "-o", str(wirings.path("serve")), *args],
        env=env,
        preexec_fn=limit,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    return server, endpoint


def peak_rss_mib(pid: int) -> float:
    """The peak resident memory (VmHWM, Linux) of process ``pid`` so far, in MiB."""
    peak = vm_hwm_mib(pid)
    if peak is None:
        raise OSError(f"no VmHWM for process {pid} (it has ended, or this is not Linux)")
    return peak


def start_http_serve(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60.0
) -> tuple[subprocess.Popen, str, dict[str, str]]:
    """``schedkit serve --http 127.0.0.1:0`` on the shipped default wiring plus ``args``
    (overlays, front-end options), KV events on free ports; returns the process once its
    front end listens, the front end's base URL and every endpoint of its ready line
    (``requests`` is the internal ZeroMQ edge). Raises RuntimeError with its stderr if it
    exits first."""
    environment = {
        **os.environ,
        "SCHEDKIT_KV_EVENTS_ENDPOINT": free_endpoint(),
        "SCHEDKIT_KV_REPLAY_ENDPOINT": free_endpoint(),
        **(env or {}),
    }
    command = [sys.executable, "-m", "schedkit.cli", "serve", str(wirings.path())]
    # stderr goes to a file: a chatty server never blocks on it, and nothing must drain it.
    with tempfile.TemporaryFile() as errors:
        server = subprocess.Popen(
            [*command, "--http", "127.0.0.1:0", *args],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        ready, _, _ = select.select([server.stdout], [], [], timeout)
        line = server.stdout.readline() if ready else ""
        if not line:
            server.kill()
            server.wait()
            errors.seek(0)
            message = errors.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"schedkit serve --http did not start: {message}")
    ready = json.loads(line)["ready"]
    return server, ready["http"], ready


def stop_serve(server: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM ``server`` and wait for it (SIGKILL after ``timeout``); its exit status."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if server.stdout is not None:
        server.stdout.close()
    return server.returncode
