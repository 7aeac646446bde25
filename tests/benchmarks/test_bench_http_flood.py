"""The flood benchmark runs end to end in its smoke mode and prints every figure and bound.

About 7 s: it starts a real ``schedkit serve --http`` on the wall clock and times requests on
it, which is what the benchmark is."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_http_flood.py"
MMM = r"[\d.]+ / [\d.]+ / [\d.]+"


def test_quick_run_prints_idle_flood_and_bounds():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for label in (
        "small request at idle",
        "step under the flood: gap between its tokens",
        r"one step: a [\d,]+-token prefill at idle",
        r"a [\d,]+-token prompt's prefill at idle",
    ):
        assert re.search(rf"^ *{label} \(ms\) +{MMM}$", out, re.MULTILINE), out
    under = (
        rf"^small request under the flood \(ms\) +{MMM} +bound 2 x idle [\d.]+: max (within|OVER)$"
    )
    assert re.search(under, out, re.MULTILINE), out
    assert re.search(
        r"^flood \([\d.]+ s\): [\d.]+ requests/s, [\d,]+ prompt tokens/s", out, re.M
    ), out
