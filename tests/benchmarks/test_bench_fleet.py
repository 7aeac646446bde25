"""The fleet benchmark runs end to end on small traces (offline open and closed loop, and
live) and prints one table row per trace, replay and policy; its plot draws each worker's
load as the fleet's summary has it."""

import importlib.util
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from schedkit.fleet.offline import run_offline
from schedkit.workloads.shaped import write_azure_shaped
from schedkit.workloads.traces import open_trace

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fleet.py"
PCT = r"\d+\.\d%"
MS = r"[\d,]+\.\d"
TOKS = r"[\d,]+"
# hits, TTFT p50 / p99, queue p99, tok/s, imbalance, wall
ROW = rf"{PCT} \| {MS} \| {MS} \| {MS} \| {TOKS} \| \d+\.\d\d \| \d+ \|$"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_fleet", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_small_run_prints_every_replay_and_policy_asked_for_on_both_traces():
    result = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--requests",
            "16",
            "--live-requests",
            "6",
            "--workers",
            "2",
            "--live-speedup",
            "8",
            "--policies",
            "kv",
            "--live-policies",
            "round_robin",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    expected = [
        r"^2 workers, llama3-8b on h100; seed 0; offline: 16 requests per trace; live: the "
        r"first 6, trace and model 8x faster, figures scaled back$",
        *(
            rf"^\| {trace} \| {replay} \| {policy} \| {ROW}"
            for trace, clients in ((r"mooncake-shaped 8/s", 32), (r"azure-shaped 40/s", 64))
            for replay, policy in (
                ("open loop", "kv"),
                (f"closed loop, {clients}", "kv"),
                ("live, 6 req", "round_robin"),
            )
        ),
    ]
    for pattern in expected:
        assert re.search(pattern, out, re.MULTILINE), f"{pattern!r} missing from:\n{out}"


def test_the_plot_draws_each_workers_load_from_the_summary(tmp_path):
    pytest.importorskip("matplotlib")
    bench = _bench()
    trace = write_azure_shaped(tmp_path / "az.csv", 40, rate=40.0)
    summaries = {
        ("azure-shaped", "open loop", policy): run_offline(
            bench.WIRING, open_trace(trace, "azure"), 2, policy, overlays=[bench.h100()]
        )
        for policy in ("round_robin", "kv")
    }
    results = {key: bench.result(s, 1.0) for key, s in summaries.items()}
    png = tmp_path / "loads.png"
    drawn = bench.plot(results, str(png))
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (450, 2 * 220)  # 2 x 1 panels of 4.5 x 2.2 in at 100 dpi
    assert len(data) > 10_000  # lines drawn, not an empty canvas
    assert drawn.keys() == summaries.keys()
    for key, summary in summaries.items():
        for (xs, ys), worker in zip(drawn[key], summary.workers, strict=True):
            t = worker.timeline
            assert len(t.seconds) > 10
            assert xs == list(t.seconds)
            assert ys == [r + q for r, q in zip(t.running, t.queued, strict=True)]


def test_unknown_policies_are_refused():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--policies", "kv,nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "--policies: unknown policies nope; valid: dynamo, kv" in result.stderr
