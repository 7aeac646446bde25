"""The offline-fleet speed benchmark runs end to end in its quick mode, here with this tree as
its own baseline, and prints both sides and the ratio."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_offline_fleet.py"
SPREAD = r"\d+\.\d\d / \d+\.\d\d / \d+\.\d\d"


def test_quick_run_prints_both_sides_and_the_ratio():
    args = ["--quick", "--baseline", str(ROOT), "--baseline-python", sys.executable]
    result = subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    expected = [
        r"^Mooncake-shaped trace, 40 requests at 3\.3/s, 8 workers offline; 1 pairs, CPU ",
        *(
            rf"^{side} \(.+\): CPU {SPREAD} s, wall {SPREAD} s, {SPREAD} ms CPU per request$"
            for side in ("baseline", "this tree")
        ),
        rf"^ratio \(baseline / this tree CPU\), 1 pairs, min / median / max = {SPREAD}  "
        r"target >= 5 \(median\): (met|NOT met)$",
    ]
    for pattern in expected:
        assert re.search(pattern, out, re.MULTILINE), f"{pattern!r} missing from:\n{out}"


def test_a_baseline_without_python_is_refused():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--baseline", "/nonexistent"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--baseline: no Python at /nonexistent/.venv/bin/python" in result.stderr
