"""Mooncake- and Azure-shaped trace writers: the published traces' properties, read back by
the trace readers."""

from __future__ import annotations

import itertools
import json
import statistics

import pytest

from schedkit.workloads.shaped import (
    lognormal_params,
    repeated_block_share,
    write_azure_shaped,
    write_mooncake_shaped,
)
from schedkit.workloads.traces import open_trace


def test_lognormal_params_give_the_mean_and_p99():
    import math

    mu, sigma = lognormal_params(12_000, 85_000)
    assert math.exp(mu + sigma * sigma / 2) == pytest.approx(12_000)
    assert math.exp(mu + 2.3263478740408408 * sigma) == pytest.approx(85_000)
    with pytest.raises(ValueError, match="no log-normal"):
        lognormal_params(1, 1e9)


def test_mooncake_shaped_has_the_published_traces_properties(tmp_path):
    path = write_mooncake_shaped(tmp_path / "mc.jsonl", 3000, seed=3)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    lengths = sorted(r["input_length"] for r in rows)
    assert 10_500 < statistics.mean(lengths) < 13_500
    assert 65_000 < lengths[int(0.99 * len(lengths))] < 110_000
    assert all(r["hash_ids"][0] == 0 for r in rows)  # the hot first block
    assert 0.32 < repeated_block_share([r["hash_ids"] for r in rows]) < 0.42
    stamps = sorted({r["timestamp"] for r in rows})
    assert all(b - a >= 3000 and (b - a) % 3000 == 0 for a, b in itertools.pairwise(stamps))
    workload = open_trace(path, "mooncake", num_requests=50)
    assert workload.num_requests == 50  # the reader takes it as it is


def test_a_smaller_block_gives_the_same_shape_shorter(tmp_path):
    path = write_mooncake_shaped(tmp_path / "mc.jsonl", 2000, seed=1, block_size=64)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert 1_300 < statistics.mean(r["input_length"] for r in rows) < 1_700
    assert 0.32 < repeated_block_share([r["hash_ids"] for r in rows]) < 0.42
    assert open_trace(path, "mooncake", block_size=64).num_requests == 2000


def test_azure_shaped_reads_back_as_azure_with_nothing_shared(tmp_path):
    path = write_azure_shaped(tmp_path / "az.csv", 400, seed=2, rate=10.0)
    workload = open_trace(path, "azure")
    arrivals = list(workload.initial())
    assert len(arrivals) == 400
    assert 30 < arrivals[-1].time < 50  # 400 at 10/s
    assert 900 < statistics.mean(len(a.req.origin_input_ids) for a in arrivals) < 1_450
    firsts = {tuple(a.req.origin_input_ids[:4]) for a in arrivals}
    assert len(firsts) == 400  # random prompts: no shared prefix
