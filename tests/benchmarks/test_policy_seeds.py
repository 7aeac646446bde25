"""The seed sweep of routing policies runs end to end on a small trace: one row per seed,
each policy's figures over round robin's, and where each policy put its requests."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "policy_seeds.py"
CELL = r"[\d,]+\.\d / [\d,]+\.\d, [\d,]+, \d+\.\d\d"
RATIO = r"\d+\.\d\d\d / \d+\.\d\d\d / \d+\.\d\d\d"


def test_two_seeds_print_a_row_each_and_the_ratios_over_round_robin():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--seeds", "2", "--requests", "24", "--policies", "dynamo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "| seed | round_robin | dynamo |" in out
    for seed in (0, 1):
        assert re.search(rf"^\| {seed} \| {CELL} \| {CELL} \|$", out, re.M), out
    assert re.search(rf"^\| dynamo \| {RATIO} \| {RATIO} \| {RATIO} \|$", out, re.M), out
    shares = re.findall(r"^\| (round_robin|dynamo) \| (\d+\.\d)% \| [\d,]+ \|$", out, re.M)
    assert [name for name, _ in shares] == ["round_robin", "dynamo"], out
    assert all(0.0 <= float(share) <= 100.0 for _, share in shares)
