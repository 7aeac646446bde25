"""The overload benchmark runs end to end in its quick mode and prints both figures and the
ratios; both rates run the same requests."""

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
    spread = rf"{NUMBER} / {NUMBER} / {NUMBER}"
    steps = r"\d+ / \d+ / \d+"
    expected = [
        rf"^calibration: sum\(range\(10\*\*6\)\) takes {NUMBER} ms of CPU here$",
        rf"^ratio \(overloaded / sustainable per token\), 1 pairs, min / median / max = {spread}  "
        r"target <= 1\.3 \(median\): (met|NOT met)$",
        rf"^ratio \(overloaded / sustainable per decode step\) = {spread}$",
    ]
    for kind, rate in (("sustainable", 4), ("overloaded", 64)):
        expected.append(
            rf"^{kind}: chat, 1000 requests, {rate} conversations/s, 1 runs \(CPU, min / median / "
            rf"max\): {spread} us per generated token, {steps} us per decode step \(median run: "
            r"(\d+) tokens, "
        )
    for pattern in expected:
        assert re.search(pattern, out, re.MULTILINE), f"{pattern!r} missing from:\n{out}"
    tokens = {
        kind: re.search(rf"^{kind}: .*median run: (\d+) tokens", out, re.MULTILINE).group(1)
        for kind in ("sustainable", "overloaded")
    }
    assert tokens["sustainable"] == tokens["overloaded"]  # the same requests at both rates
