"""Fleet figures: per worker and merged, the imbalance, the table and the JSON object."""

from __future__ import annotations

import json
import math

from schedkit.core.schedule_batch import FinishAbort, Req, SamplingParams
from schedkit.fleet.summary import FleetSummary, merge_tallies, worker_figures
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
    workers = [
        worker_figures("0", one, routed=1, cached_tokens=0, computed_tokens=10),
        worker_figures("1", two, routed=3, cached_tokens=30, computed_tokens=10, alive=False),
    ]
    fleet = worker_figures(
        "fleet", merge_tallies([one, two]), routed=4, cached_tokens=30, computed_tokens=20
    )
    assert fleet.requests_done == 3
    assert math.isclose(fleet.ttft_p50, 0.3)
    assert math.isclose(fleet.prefix_cache_hit_rate, 0.6)
    assert math.isclose(workers[1].tpot_p50, 0.2)
    summary = FleetSummary(
        policy="kv",
        mode="live",
        workers=workers,
        fleet=fleet,
        simulated_seconds=math.nan,
        wall_seconds=3.0,
    )
    assert summary.load_imbalance == 1.5  # 3 routed against a mean of 2
    lines = summary.table().splitlines()
    assert lines[0].split()[:4] == ["worker", "routed", "done", "failed"]
    assert lines[1].split()[:2] == ["0", "1"]
    assert lines[1].split()[-3:] == ["0.0%", "-", "-"]  # wall and RSS not measured
    assert lines[2].split()[:3] == ["1", "(dead)", "3"]
    assert lines[4].split()[:3] == ["fleet", "4", "3"]
    assert lines[5] == "router kv (live); load imbalance (max / mean requests per worker) 1.50"
    assert lines[6] == "wall seconds 3.00"
    data = json.loads(json.dumps(summary.to_dict()))
    assert data["load_imbalance"] == 1.5
    assert data["workers"][1]["alive"] is False
    assert data["workers"][0]["peak_rss_mib"] is None  # NaN: not measured
    assert data["fleet"]["prefix_cache_hit_rate"] == 0.6
    assert {"ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "e2e_p90_s", "wall_s"} <= set(data["fleet"])
    assert "TTFT ms p50/p90/p99" in lines[0] and "E2E s p50/p90/p99" in lines[0]
    assert lines[4].split()[4:8] == [
        "300.0/460.0/496.0",
        "200.0/200.0/200.0",
        "-/-/-",
        "2.30/2.46/2.50",
    ]


def test_the_table_says_the_time_spent_before_the_run():
    summary = FleetSummary(
        policy="kv",
        mode="offline",
        workers=[],
        fleet=worker_figures("fleet", Tally(), routed=0, cached_tokens=0, computed_tokens=0),
        simulated_seconds=1.5,
        wall_seconds=0.07,
        setup_seconds=12.9,
    )
    assert summary.table().splitlines()[-1] == (
        "simulated seconds 1.50; wall seconds 0.07 (and 12.90 building the workers before)"
    )
    assert summary.to_dict()["setup_wall_s"] == 12.9
