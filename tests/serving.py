"""A real ``schedkit serve`` on free loopback ports, for the end-to-end tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_endpoint() -> str:
    """A tcp endpoint on 127.0.0.1 whose port was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def start_serve() -> tuple[subprocess.Popen, str]:
    """``schedkit serve wiring.yaml -o examples/serve.yaml`` with its request endpoint and KV
    events on free ports; returns the process and the request endpoint."""
    endpoint = free_endpoint()
    env = {
        **os.environ,
        "SCHEDKIT_REQUEST_ENDPOINT": endpoint,
        "SCHEDKIT_KV_EVENTS_ENDPOINT": free_endpoint(),
        "SCHEDKIT_KV_REPLAY_ENDPOINT": free_endpoint(),
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "schedkit.cli", "serve", "wiring.yaml", "-o", "examples/serve.yaml"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return server, endpoint
