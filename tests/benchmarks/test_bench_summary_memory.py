"""The summary-memory benchmark runs end to end in its quick mode and prints both peaks."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_summary_memory.py"
NUMBER = r"\d+\.\d+"


def test_quick_run_prints_the_peaks_and_the_ratio():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    peaks = re.search(
        rf"^chat, 1000 requests at 4 conversations/s, 1 runs: peak RSS before the summary "
        rf"({NUMBER}) MiB, after ({NUMBER}) MiB \(median run; \d+ tokens, 1000 requests done\)$",
        out,
        re.MULTILINE,
    )
    assert peaks, out
    assert 0 < float(peaks.group(1)) <= float(peaks.group(2))
    ratio = rf"{NUMBER} / {NUMBER} / {NUMBER}"
    assert re.search(
        rf"^ratio \(peak after / before the summary\), min / median / max = {ratio}  "
        r"target <= 1\.1: (met|NOT met)$",
        out,
        re.MULTILINE,
    ), out
