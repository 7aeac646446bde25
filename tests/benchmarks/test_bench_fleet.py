"""The fleet benchmark runs end to end on a small trace and prints both policies' figures."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fleet.py"
PCT = r"\d+\.\d%"
NUMBER = r"\d+\.\d+"
ROW = rf"{NUMBER} \| {NUMBER} \| {NUMBER} \| {NUMBER} \| \d+ \|$"  # TTFTs, imbalance, wall, RSS


def test_small_run_prints_kv_and_round_robin_figures():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--requests", "150", "--no-live", "--plot", "/dev/null"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    expected = [
        r"^trace: 150 Mooncake-shaped requests at 32/s, seed 0$",
        r"^\(a\) offline, 8 workers$",
        *(
            rf"^\| {re.escape(policy)} \| {PCT} \| {ROW}"
            for policy in ("kv", "round_robin", "kv 0.5/32/1.1")
        ),
        *(rf"^\| {rank} \| \d+, {PCT}, " for rank in range(8)),
        r"^(plot written to /dev/null|no plot: matplotlib is not installed)",
    ]
    for pattern in expected:
        assert re.search(pattern, out, re.MULTILINE), f"{pattern!r} missing from:\n{out}"


def test_a_worker_that_got_no_request_prints_dashes(capsys):
    from benchmarks.bench_fleet import print_offline

    idle = {"requests_routed": 0, "prefix_cache_hit_rate": None, "ttft_p50_s": None}
    busy = {"requests_routed": 3, "prefix_cache_hit_rate": 0.5, "ttft_p50_s": 0.02}
    workers = [{**busy, "wall_seconds": 0.1}] + [{**idle, "wall_seconds": 0.0}] * 7
    fleet = {**busy, "ttft_p99_s": 0.04, "peak_rss_mib": 90.0}
    print_offline({"kv": {"fleet": fleet, "workers": workers, "load_imbalance": 8.0}}, {"kv": 1.0})
    out = capsys.readouterr().out
    assert "| kv | 50.0% | 20.0 | 40.0 | 8.00 | 1.0 | 90 |" in out
    assert "| 0 | 3, 50.0%, 20.0, 0.1 |" in out and "| 7 | 0, -, -, 0.0 |" in out
