"""The fleet benchmark runs end to end on a small trace and prints both policies' figures."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fleet.py"
PCT = r"\d+\.\d%"
NUMBER = r"\d+\.\d+"
ROW = rf"{NUMBER} \| {NUMBER} \| {NUMBER} \| {NUMBER} \| \d+ \|$"  # TTFTs, imbalance, wall, RSS


def test_small_run_prints_kv_and_round_robin_figures():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--requests", "150", "--no-live", "--plot", "/dev/null"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    expected = [
        r"^trace: 150 Mooncake-shaped requests at 32/s, seed 0$",
        r"^\(a\) offline, 8 workers$",
        *(
            rf"^\| {re.escape(policy)} \| {PCT} \| {ROW}"
            for policy in ("kv", "round_robin", "kv 0.5/32/1.1")
        ),
        *(rf"^\| {rank} \| \d+, {PCT}, " for rank in range(8)),
        r"^(plot written to /dev/null|no plot: matplotlib is not installed)",
    ]
    for pattern in expected:
        assert re.search(pattern, out, re.MULTILINE), f"{pattern!r} missing from:\n{out}"
