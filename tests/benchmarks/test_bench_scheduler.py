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
    spread = rf"{NUMBER} / {NUMBER} / {NUMBER}"
    expected = [
        rf"^calibration: sum\(range\(10\*\*6\)\) takes {NUMBER} ms of CPU here",
        rf"^\(a\) YAML assembly: +{spread} s CPU \(min / median / max, 2 runs\)$",
        rf"^\(a\) hand-built: +{spread} s CPU \(min / median / max, 2 runs\)$",
        rf"^ratio a \(YAML / hand-built CPU\), 2 pairs, min / median / max = {spread}  "
        r"target <= 1\.03: (met|NOT met)$",
        r"^\(a\) same results from both assemblies: yes$",
        rf"^ratio b on \(output_tally\) / off, 1 groups, min / median / max = {spread}  "
        r"target <= 1\.4: (met|NOT met)$",
        rf"^ratio b on \(recording collector\) / off, 1 groups, min / median / max = {spread}$",
        r"^\(c\) nano-vllm: not measured; pass --nano-vllm DIR \(a nano-vllm checkout\)$",
    ]
    for mode in ("off", r"on \(output_tally\)", r"on \(recording collector\)"):
        expected.append(
            rf"^\(b\) events\+streaming {mode}: {spread} us/token \(min / median / max, 1 runs; "
            rf"~{NUMBER} on a desktop\), {spread} us/decode step; scheduler thread alone "
            rf"{NUMBER} us/token \(\d+ tokens, \d+ decode steps\)$"
        )
    for pattern in expected:
        assert re.search(pattern, out, re.MULTILINE), f"{pattern!r} missing from:\n{out}"
