"""The KV-event benchmark runs end to end in its quick mode and reports its three ratios."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kv_events.py"


def test_quick_run_prints_the_three_ratios():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    for name in ("a", "b", "c"):
        line = re.search(rf"ratio {name} \(.*\) = (\d+\.\d+)  target .*: (met|NOT met)$",
                         result.stdout, re.MULTILINE)  # fmt: skip
        assert line, f"ratio {name} missing from:\n{result.stdout}"
        assert float(line.group(1)) > 0
    assert re.search(r"publisher -> KvEventSubscriber: +[\d,]+ events/s", result.stdout)
    assert re.search(r"events on: +[\d,]+ inserts/s", result.stdout)
    assert re.search(r"hashing only / off = \d+\.\d+ \(pack \+ SHA-256 per page", result.stdout)
    assert re.search(r"publish\(\): +\d+\.\d ns per event", result.stdout)
