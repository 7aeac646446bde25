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
    for name in ("a", "c"):
        line = re.search(rf"ratio {name} \(.*\) = (\d+\.\d+)  target .*: (met|NOT met)$",
                         result.stdout, re.MULTILINE)  # fmt: skip
        assert line, f"ratio {name} missing from:\n{result.stdout}"
        assert float(line.group(1)) > 0
    spread = r"(\d+\.\d+) / (\d+\.\d+) / (\d+\.\d+)"
    for side, target in (("on native", "1.35"), ("on python", "1.8")):
        line = re.search(
            rf"ratio b \({side} / off\) += {spread}  target <= {target}: (met|NOT met)$",
            result.stdout,
            re.MULTILINE,
        )
        assert line, f"ratio b ({side}) missing from:\n{result.stdout}"
        low, mid, high = map(float, line.groups()[:3])
        assert 0 < low <= mid <= high
    assert re.search(r"publisher -> KvEventSubscriber: +[\d,]+ events/s", result.stdout)
    assert re.search(rf"on native: +{spread} us per insert", result.stdout)
    assert re.search(r"CPU time, 5 interleaved rounds, min / median / max; chain: ", result.stdout)
    assert re.search(r"publish\(\): +\d+\.\d ns per event", result.stdout)
