"""The scheduler benchmark runs end to end in its quick mode and prints every figure."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_scheduler.py"
NUMBER = r"\d+\.\d+"


def test_quick_run_prints_the_assembly_ratio_and_cpu_figures():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    expected = [
        rf"^calibration: sum\(range\(10\*\*6\)\) takes {NUMBER} ms of CPU here",
        rf"^\(a\) YAML assembly: +median {NUMBER} s, min {NUMBER} s over \d+ runs",
        rf"^\(a\) hand-built: +median {NUMBER} s, min {NUMBER} s over \d+ runs",
        rf"^ratio a \(YAML / hand-built wall time\) = {NUMBER} \(medians\), {NUMBER} "
        rf"\(minimums\)  target <= 1\.03: (met|NOT met)$",
        r"^\(a\) same results from both assemblies: yes$",
        r"^\(b\) events\+streaming on \(KV events on tcp://127\.0\.0\.1:\d+\): \d+ tokens, "
        r"\d+ decode steps$",
    ]
    for mode in ("off", "on"):
        expected += [
            rf"^\(b\) events\+streaming {mode}: {NUMBER} us/token \(min {NUMBER}\), "
            rf"{NUMBER} us/decode step; scheduler thread alone {NUMBER} us/token$",
            rf"^\(b\) events\+streaming {mode}: normalised to a {NUMBER} ms calibration: "
            rf"{NUMBER} us/token vs nano-vllm ~0\.7 us/token: (met|NOT met)$",
        ]
    for pattern in expected:
        assert re.search(pattern, out, re.MULTILINE), f"{pattern!r} missing from:\n{out}"
