"""The HTTP benchmark runs end to end at a tiny size and prints both edges' figures."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_http.py"
MMM = r"[\d,.]+ / [\d,.]+ / [\d,.]+"


def test_tiny_run_prints_both_edges_side_by_side():
    result = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--rounds",
            "2",
            "--seconds",
            "0.3",
            "--concurrency",
            "4",
            "--streams",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for kind in ("short", "stream"):
        for edge in ("http", "zmq"):
            assert re.search(
                rf"^\| {kind} \| {edge} \| {MMM} \| {MMM} \| {MMM} \| {MMM} \|$", out, re.MULTILINE
            ), out
        assert re.search(rf"^{kind}: HTTP / ZMQ server CPU per token .*: {MMM}$", out, re.MULTILINE)
    assert re.search(
        r"^  p50: HTTP [\d.]+ ms, ZMQ [\d.]+ ms, added by HTTP -?[\d.]+ ms$", out, re.MULTILINE
    ), out
    assert re.search(r"^  p99: HTTP ", out, re.MULTILINE)
