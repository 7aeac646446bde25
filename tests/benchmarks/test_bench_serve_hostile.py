"""The hostile-clients serve benchmark runs end to end in its quick mode and prints each figure."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_serve_hostile.py"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")
def test_quick_run_prints_memory_and_latencies():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"flood of 100 x 32k tokens: refused / taken +68 / 32$", out, re.MULTILINE)
    for figure in (
        "32 MiB frame of \\[\\] refused in \\(ms\\)",
        "peak RSS of the whole run \\(MiB\\)",
    ):
        assert re.search(figure + r" +\d+(\.\d)?$", out, re.MULTILINE), out
    assert re.search(r"request under 1 MiB invalid frames \(s\) +\d+\.\d\d$", out, re.MULTILINE)
    spread = r" +\d+(\.\d)? / \d+(\.\d)? / \d+(\.\d)?$"
    for figure in (
        "small request behind a 100-request flood \\(ms\\)",
        "1,000 idle connections: serve CPU \\(% of a core\\)",
        "12 x 32 MiB frames held: peak RSS \\(MiB\\)",
        'endless "more" frames: peak RSS \\(MiB\\)',
    ):
        assert re.search(figure + spread, out, re.MULTILINE), out
