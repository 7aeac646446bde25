"""Running an example's own test suite and the schedkit command from the examples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

# The inner runs share this process; hypothesis's plugin would import hypothesis afresh in each.
INNER_ARGS = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider")


def run_example_tests(pytester: pytest.Pytester, name: str) -> pytest.RunResult:
    """Run ``examples/<name>``'s tests as a user would (``pytest`` in the example directory)."""
    return pytester.runpytest(str(EXAMPLES / name), *INNER_ARGS)


def schedkit_run(example: str, *args: str) -> dict:
    """``schedkit run ... --json`` from the repository root with the example's directory on
    PYTHONPATH and KV events on free ports; returns the summary."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(EXAMPLES / example), env.get("PYTHONPATH")) if p
    )
    env["SCHEDKIT_KV_EVENTS_ENDPOINT"] = "tcp://127.0.0.1:0"
    env["SCHEDKIT_KV_REPLAY_ENDPOINT"] = "tcp://127.0.0.1:0"
    result = subprocess.run(
        [sys.executable, "-m", "schedkit.cli", "run", *args, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
