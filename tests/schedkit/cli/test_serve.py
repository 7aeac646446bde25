"""``schedkit serve --admin-token`` refuses a wiring whose request receiver takes no network
requests, before building anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_an_admin_token_needs_a_zmq_server_receiver():
    command = [sys.executable, "-m", "schedkit.cli", "serve", "wiring.yaml", "--admin-token", "t"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--admin-token needs a zmq_server request_receiver" in result.stderr
    assert "Traceback" not in result.stderr
