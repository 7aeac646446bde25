"""A run's figures as JSON (NaN as null) and as a table."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import attrs
import pytest

from schedkit.sim.run_summary import RunSummary, json_figures

NAN = math.nan


def summary(**changes) -> RunSummary:
    figures = dict.fromkeys(
        (f.name for f in attrs.fields(RunSummary) if f.default is attrs.NOTHING), 0
    )
    return RunSummary(**{**figures, "ttft_p50": 0.25, "prefix_cache_hit_rate": NAN, **changes})


def test_json_figures_turn_only_nan_into_null():
    figures = {"a": NAN, "b": 0.5, "c": 3, "d": "kv", "e": math.inf, "f": None}
    assert json_figures(figures) == {
        "a": None,
        "b": 0.5,
        "c": 3,
        "d": "kv",
        "e": math.inf,
        "f": None,
    }


def test_run_summary_json_is_strict_json_and_the_table_says_it_was_interrupted():
    data = json.loads(json.dumps(summary().to_dict(), allow_nan=False))
    assert data["ttft_p50_s"] == 0.25
    assert data["prefix_cache_hit_rate"] is None and data["tpot_p99_s"] is None
    table = summary(interrupted=True).table().splitlines()
    assert table[0].startswith("interrupted") and "finished so far" in table[0]
    assert any(line.startswith("TTFT p50 / p90 / p99 (ms)") and "250.0" in line for line in table)


def test_the_hit_rate_by_tier_shows_only_for_a_cache_with_a_host_tier():
    plain = summary(prefix_cache_hit_rate=0.5).table()
    assert "device | host" not in plain
    assert summary().to_dict()["prefix_cache_hit_rate_host"] is None
    tiered = (
        summary(
            prefix_cache_hit_rate=0.5,
            prefix_cache_hit_rate_device=0.4,
            prefix_cache_hit_rate_host=0.1,
        )
        .table()
        .splitlines()
    )
    at = next(i for i, line in enumerate(tiered) if line.startswith("prefix-cache hit rate"))
    assert tiered[at + 1].split() == ["of", "which", "device", "|", "host", "40.0%", "|", "10.0%"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_a_run_started_from_a_large_process_reports_its_own_peak():
    """``subprocess`` starts a child with vfork and exec, and Linux keeps the parent's resident
    size in the child's ``ru_maxrss``: the peak must be the child's own address space."""
    held = bytearray(256 * 2**20)
    held[::4096] = b"\1" * len(held[::4096])  # touched, so resident
    code = "from schedkit.sim.run_summary import peak_rss_mb; print(peak_rss_mb())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(child.stdout) < 200, child.stdout
    del held
