"""The overload benchmark runs end to end in its quick mode and prints both figures and the
ratio."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_overload.py"
NUMBER = r"\d+\.\d+"


def test_quick_run_prints_both_costs_and_the_ratio():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    expected = [
        rf"^calibration: sum\(range\(10\*\*6\)\) takes {NUMBER} ms of CPU here$",
        rf"^sustainable: chat, 1000 requests, 4 conversations/s: {NUMBER} us CPU per generated "
        rf"token \(\d+ tokens, ",
        rf"^overloaded: chat, 1000 requests, 64 conversations/s: {NUMBER} us CPU per generated "
        rf"token \(\d+ tokens, ",
        rf"^ratio \(overloaded / sustainable per token\) = {NUMBER}  target <= 1\.3: "
        r"(met|NOT met)$",
    ]
    for pattern in expected:
        assert re.search(pattern, out, re.MULTILINE), f"{pattern!r} missing from:\n{out}"
