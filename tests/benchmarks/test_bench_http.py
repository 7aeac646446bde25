"""The HTTP benchmark runs end to end at a tiny size and prints both edges' figures."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_http.py"
MMM = r"-?[\d,.]+ / -?[\d,.]+ / -?[\d,.]+"


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
        for edge, front in (("http", MMM), ("zmq", "-")):
            cells = " \\| ".join([kind, edge, MMM, MMM, MMM, front, MMM, MMM])
            assert re.search(rf"^\| {cells} \|$", out, re.MULTILINE), out
        assert re.search(rf"^saturated {kind}: HTTP / ZMQ server CPU per .*: {MMM}$", out, re.M)
    for q in ("p50", "p99"):
        assert re.search(
            rf"^  {q} latency \(ms\): HTTP {MMM}, ZMQ {MMM}, added by HTTP -?{MMM}$", out, re.M
        ), out
    assert re.search(rf"^  HTTP / ZMQ server CPU per request at equal rate: {MMM}$", out, re.M)
    for kind in ("short", "stream"):
        for edge in ("http", "zmq"):
            assert re.search(rf"^\| {kind} \| {edge}( \| {MMM}){{4}} \|$", out, re.M), out
    for kind, unit in (("short", "requests/s"), ("stream", "tokens/s")):
        assert re.search(
            rf"^target >= [\d,]+ HTTP {kind} {unit}: wall clock {MMM}, per core {MMM}, a core "
            rf"per process {MMM}; wall clock met in \d of 2 rounds, per core met in \d of 2 "
            "rounds$",
            out,
            re.M,
        ), out
    assert re.search(r"^machine load average \(1 / 5 / 15 min\): [\d. /]+ at the start", out, re.M)
