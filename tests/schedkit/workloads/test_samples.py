"""Run samples: percentiles sorted once, CDF points, the bounded timeline, per-request figures."""

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedkit.core.schedule_batch import FinishAbort, FinishLength, Req
from schedkit.workloads.samples import Tally, Timeline, cdf_points, percentiles


def test_percentiles_interpolate_linearly():
    assert percentiles([3.0, 1.0, 2.0, 4.0], (0, 50, 100)) == [1.0, 2.5, 4.0]
    assert percentiles([7.0]) == [7.0, 7.0, 7.0]
    assert all(math.isnan(v) for v in percentiles([]))


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=3000), st.integers(2, 500))
def test_cdf_points_are_thinned_ranks_of_the_sorted_values(values, max_points):
    xs, ys = cdf_points(values, max_points)
    ordered = sorted(values)
    assert len(xs) == len(ys) <= max_points + 1
    assert xs[-1] == ordered[-1] and ys[-1] == 1.0
    assert xs == sorted(xs) and ys == sorted(ys) and ys[0] > 0
    for x, y in zip(xs, ys, strict=True):
        rank = round(y * len(values)) - 1
        assert ordered[rank] == x


def test_cdf_points_of_nothing_and_a_bad_size():
    assert cdf_points([]) == ([], [])
    with pytest.raises(ValueError, match="max_points must be at least 2"):
        cdf_points([1.0], 1)


def test_timeline_stays_bounded_and_evenly_spaced():
    timeline = Timeline(capacity=8)
    for step in range(1000):
        timeline.add(step * 0.5, step % 7, step)
    assert len(timeline.seconds) < 8
    assert timeline.stride == 256
    # the kept samples are every stride-th step from the first
    assert list(timeline.queued) == list(range(0, 1000, 256))
    assert list(timeline.seconds) == [q * 0.5 for q in timeline.queued]
    assert list(timeline.running) == [q % 7 for q in timeline.queued]
    with pytest.raises(ValueError, match="even number"):
        Timeline(capacity=5)


def test_memory_stays_flat_over_a_long_run():
    timeline = Timeline()
    for step in range(200_000):
        timeline.add(float(step), 1, 2)
    assert len(timeline.seconds) < timeline.capacity


def finished(rid, arrival, scheduled, first, finish, tokens, itl=()):
    req = Req(rid=rid, origin_input_ids=[1, 2, 3], arrival_time=arrival)
    req.scheduled_time, req.first_token_time, req.finish_time = scheduled, first, finish
    req.output_ids = list(range(tokens))
    req.itl = list(itl)
    req.finished_reason = FinishLength(tokens)
    return req


def test_run_samples_keep_ttft_tpot_e2e_queue_time_and_itl():
    samples = Tally()
    samples.add(finished("a", 1.0, 1.5, 2.0, 6.0, 5, itl=[1.0] * 4))
    samples.add(finished("b", 0.0, 0.0, 0.25, 0.25, 1))  # one token: no TPOT
    aborted = finished("c", 0.0, None, None, 1.0, 0)
    aborted.finished_reason = FinishAbort("refused")
    samples.add(aborted)
    assert (samples.done, samples.failed, samples.output_tokens) == (2, 1, 6)
    assert list(samples.ttft) == [1.0, 0.25]
    assert list(samples.tpot) == [(6.0 - 2.0) / 4]
    assert list(samples.e2e) == [5.0, 0.25]
    assert list(samples.queue_time) == [0.5, 0.0]
    assert list(samples.itl) == [1.0] * 4


def test_percentiles_match_sorting_each_time():
    rng = random.Random(1)
    values = [rng.random() for _ in range(1001)]
    ordered = sorted(values)
    assert percentiles(values, (0, 50, 100)) == [ordered[0], ordered[500], ordered[1000]]


@pytest.mark.parametrize("capacity", [2, 8, 4096])
def test_timeline_runs_keep_what_steps_one_by_one_keep(capacity):
    rng = random.Random(capacity)
    one_by_one, in_runs = Timeline(capacity=capacity), Timeline(capacity=capacity)
    step = 0
    for _ in range(300):
        seconds = [(step + i) * 0.25 for i in range(rng.choice([1, 2, 3, 7, 40, 129]))]
        running, queued = rng.randrange(5), rng.randrange(5)
        for t in seconds:
            one_by_one.add(t, running, queued)
        in_runs.add_run(seconds, running, queued)
        step += len(seconds)
    assert in_runs == one_by_one
