"""Fleet figures: per worker and merged, the imbalance, the table and the JSON object."""

from __future__ import annotations

import json
import math

import pytest

from schedkit.core.schedule_batch import FinishAbort, Req, SamplingParams
from schedkit.fleet.summary import RouterFigures, WorkerTotals, fleet_summary
from schedkit.fleet.summary_table import fleet_table
from schedkit.workloads.samples import Tally


def finished(rid: str, arrival: float, first: float, finish: float, outputs: int) -> Req:
    req = Req(rid=rid, origin_input_ids=[1, 2, 3], sampling_params=SamplingParams())
    req.arrival_time, req.first_token_time, req.finish_time = arrival, first, finish
    req.output_ids = list(range(outputs))
    return req


def test_tally_takes_ttft_tpot_and_end_to_end_latency():
    tally = Tally()
    tally.add(finished("a", 1.0, 1.5, 3.5, 5))  # 4 tokens after the first in 2 s
    tally.add(finished("b", 0.0, 0.25, 0.25, 1))  # one token: no TPOT
    failed = finished("c", 0.0, 0.1, 0.2, 2)
    failed.finished_reason = FinishAbort(message="gone")
    tally.add(failed)
    assert (tally.done, tally.failed, tally.output_tokens) == (2, 1, 6)
    assert list(tally.ttft) == [0.5, 0.25]
    assert list(tally.tpot) == [0.5]
    assert list(tally.e2e) == [2.5, 0.25]


def test_fleet_figures_table_and_json():
    one, two = Tally(), Tally()
    one.add(finished("a", 0.0, 0.1, 1.1, 11))
    two.add(finished("b", 0.0, 0.3, 2.3, 11))
    two.add(finished("c", 0.0, 0.5, 2.5, 11))
    two.timeline.add(1.0, 2, 5)
    workers = [
        WorkerTotals(tally=one, routed=2, refused=1, input_tokens=3, computed_tokens=10),
        WorkerTotals(
            tally=two, routed=3, timed_out=1, failed=1, cached_tokens=30, computed_tokens=10
        ),
    ]
    workers[1].alive = False
    router = RouterFigures(requests_refused=2, peak_queued_requests=7)
    summary = fleet_summary(
        policy="kv",
        mode="live",
        replay="open loop",
        admission="none",
        workers=workers,
        router=router,
        run_seconds=3.0,
        simulated_seconds=math.nan,
        wall_seconds=3.0,
        setup_seconds=1.5,
    )
    fleet = summary.fleet
    assert fleet.requests_done == 3
    assert (fleet.requests_refused, fleet.requests_timed_out, fleet.requests_failed) == (3, 1, 1)
    assert math.isclose(fleet.ttft_p50_s, 0.3) and math.isclose(fleet.ttft_p90_s, 0.46)
    assert math.isclose(fleet.prefix_cache_hit_rate, 0.6)
    assert math.isclose(fleet.output_throughput_tok_per_s, 33 / 3.0)
    assert math.isclose(summary.workers[1].tpot_p50_s, 0.2)
    assert math.isnan(fleet.queue_time_p50_s)  # nothing measured it
    assert summary.load_imbalance == 1.2  # 3 routed against a mean of 2.5
    lines = fleet_table(summary).splitlines()
    assert lines[3].split()[-7:] == ["3", "/", "3", "/", "1", "/", "1"]
    assert lines[4].split()[-7:] == ["2", "/", "0", "/", "0", "/", "0"]
    assert "TTFT p50 / p90 / p99 (ms)" in fleet_table(summary)
    [setup] = [line for line in lines if line.startswith("workers started before the run")]
    assert setup.split()[-1] == "1.50" and "(wall s)" in setup
    rows = lines[lines.index("") + 1 :]
    assert rows[0].split()[:3] == ["worker", "routed", "done"]
    assert rows[1].split()[:6] == ["0", "2", "1", "1", "0", "0"]
    assert rows[2].split()[:7] == ["1", "(dead)", "3", "2", "0", "1", "1"]
    assert "5.0 / 5" in rows[2]  # queued requests: mean / peak over its load samples
    data = json.loads(json.dumps(summary.to_dict()))
    assert data["load_imbalance"] == 1.2
    assert data["workers"][1]["alive"] is False
    assert data["workers"][0]["peak_rss_mib"] is None  # NaN: not measured
    assert data["workers"][1]["load_over_time"] == {
        "seconds": [1.0],
        "running_requests": [2],
        "queued_requests": [5],
    }
    assert data["router"]["requests_refused"] == 2
    assert data["fleet"]["prefix_cache_hit_rate"] == 0.6
    assert data["fleet"]["ttft_p90_s"] == pytest.approx(0.46)
