"""The bound on a prefill step's modelled time (``max_prefill_step_seconds``), alone and in the
scheduler on the virtual clock with the default cost model: every chunk within the bound at
every depth, and a small request of another client, arriving as any step of a 30k-token flood
begins, within twice its time alone (without the bound, a chunk in progress alone costs more)."""

from __future__ import annotations

import pytest

from schedkit.components.scheduler.prefill_step_bound import PrefillStepBound
from schedkit.core.component import ArgumentError
from schedkit.core.schedule_batch import ForwardMode, ScheduleBatch
from schedkit.runner.model_runner import SimulatedModelRunner
from tests.components.scheduler.test_scheduler import assert_all_done, build, make_req, tokens

COST = SimulatedModelRunner()
# Two decode steps of one request at idle, as ``schedkit serve --http`` sets it.
BUDGET = 2 * (COST.decode_fixed + COST.decode_per_seq)


def test_prefill_seconds_is_the_runners_cost_of_one_requests_prefill():
    for fresh, prefix in ((16, 0), (448, 0), (192, 32576)):
        batch = ScheduleBatch(
            reqs=[None], forward_mode=ForwardMode.EXTEND, prefix_lens=[prefix], extend_lens=[fresh]
        )
        assert COST.prefill_seconds(fresh, prefix) == pytest.approx(COST.prefill_cost(batch))
    assert SimulatedModelRunner(zero_cost=True).prefill_seconds(8192, 8192) == 0.0


def test_tokens_at_is_the_most_whole_pages_within_the_budget_at_each_depth():
    calls = []

    def seconds(tokens: int, prefix: int) -> float:
        calls.append((tokens, prefix))
        return COST.prefill_seconds(tokens, prefix)

    bound = PrefillStepBound(
        max_seconds=BUDGET, prefill_seconds=seconds, page_size=16, max_tokens=8192
    )
    previous = 1 << 30
    for prefix in (0, 1, 4096, 16384, 32752):
        allowed = bound.tokens_at(prefix)
        depth = -(-prefix // 16) * 16
        assert allowed % 16 == 0 and allowed <= previous
        assert (
            COST.prefill_seconds(allowed, depth)
            <= BUDGET
            < COST.prefill_seconds(allowed + 16, depth)
        )
        previous = allowed
    assert (bound.tokens_at(0), bound.tokens_at(32752)) == (448, 192)
    asked = len(calls)
    bound.tokens_at(4090)  # the same page as 4096: answered from what was found
    assert len(calls) == asked
    tight = PrefillStepBound(max_seconds=1e-6, prefill_seconds=seconds, page_size=16, max_tokens=64)
    assert tight.tokens_at(32000) == 16  # one page at least
    loose = PrefillStepBound(max_seconds=10.0, prefill_seconds=seconds, page_size=16, max_tokens=64)
    assert loose.tokens_at(0) == 64  # at most max_tokens


def _flooded(step_seconds: float | None, arrive_after: int | None):
    """Client a's two 30,000-token prompts, then (after ``arrive_after`` steps) client b's
    16-token request with 4 new; b's latency from the start of the step it arrived in."""
    env = build(
        pool=80_000,
        page_size=16,
        client_of=lambda req: req.rid[0],
        max_prefill_step_seconds=step_seconds,
        prefill_seconds=COST.prefill_seconds if step_seconds else None,
    )
    env.runner.inner = SimulatedModelRunner()  # the default cost model, virtual clock
    s, now = env.s, env.runner.now
    flood = [
        make_req(f"a{i}", tokens(30_000, 1000 + 40_000 * i), max_new_tokens=16) for i in (0, 1)
    ]
    small = make_req("b", tokens(16, 90_000), max_new_tokens=4)
    if arrive_after is None:
        reqs, arrived = [small], 0.0
        s.submit(small)
    else:
        reqs = [*flood, small]
        for req in flood:
            s.submit(req)
        for _ in range(arrive_after):
            assert s.step()
        arrived = now()
        assert s.step()  # the step in progress when b arrives
        s.submit(small)
    while small.finished_reason is None:
        assert s.step()
    latency = now() - arrived
    s.run_until_idle()
    assert_all_done(env, reqs)
    return env, latency


def test_every_prefill_step_stays_within_the_bound_and_a_small_request_within_twice_idle():
    _, idle = _flooded(BUDGET, None)
    bound = PrefillStepBound(
        max_seconds=BUDGET, prefill_seconds=COST.prefill_seconds, page_size=16, max_tokens=8192
    )
    for arrive_after in (1, 40, 110, 150):
        env, latency = _flooded(BUDGET, arrive_after)
        assert latency <= 2 * idle, (arrive_after, latency, idle)
        for batch in env.runner.prefills():
            assert sum(batch.extend_lens) <= bound.tokens_at(max(batch.prefix_lens))
        assert env.runner.batches[-1].mode == ForwardMode.DECODE
    # Without the bound, a request arriving as a flood chunk begins waits for all of it.
    _, unbounded = _flooded(None, 2)
    assert unbounded > 2 * idle, (unbounded, idle)


def test_a_bound_without_its_cost_model_or_not_positive_is_refused():
    with pytest.raises(ArgumentError, match="go together"):
        build(max_prefill_step_seconds=0.01)
    with pytest.raises(ArgumentError, match="go together"):
        build(prefill_seconds=COST.prefill_seconds)
    for bad in (0, -1.0, float("nan"), float("inf"), "12ms"):
        with pytest.raises(ArgumentError, match="seconds > 0"):
            build(max_prefill_step_seconds=bad, prefill_seconds=COST.prefill_seconds)
