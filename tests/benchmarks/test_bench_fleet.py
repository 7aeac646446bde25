"""The fleet benchmark runs end to end on small traces and prints one table row per trace and
policy."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fleet.py"
PCT = r"\d+\.\d%"
MS = r"[\d,]+\.\d"
TOKS = r"[\d,]+"
ROW = rf"{PCT} \| {MS} \| {MS} \| {TOKS} \| \d+\.\d\d \| \d+ \|$"  # hits, TTFTs, tok/s, imbalance


def test_small_run_prints_every_policy_asked_for_on_both_traces():
    result = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--requests",
            "40",
            "--policies",
            "round_robin,kv",
            "--plot",
            "/dev/null",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    expected = [
        r"^8 workers, llama3-8b on h100, offline; 40 requests per trace, seed 0$",
        *(
            rf"^\| {trace} \| {policy} \| {ROW}"
            for trace in (r"mooncake-shaped 8/s", r"azure-shaped 40/s")
            for policy in ("round_robin", "kv")
        ),
        r"^(plot written to /dev/null|no plot: matplotlib is not installed)",
    ]
    for pattern in expected:
        assert re.search(pattern, out, re.MULTILINE), f"{pattern!r} missing from:\n{out}"


def test_unknown_policies_are_refused():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--policies", "kv,nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "unknown policies nope; valid: dynamo, kv" in result.stderr
