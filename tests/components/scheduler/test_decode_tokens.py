"""DecodeTokens against per-request stamping: same tokens, token times, gaps and finish checks."""

import random

import pytest

from schedkit.components.scheduler import decode_tokens
from schedkit.components.scheduler.decode_tokens import DecodeTokens
from schedkit.core.schedule_batch import Req, SamplingParams

EOS = 99


def reference_step(state, reqs, tokens, now, eos):
    """Append, stamp and list the requests that may have finished, one request at a time."""
    maybe = []
    for req, tok in zip(reqs, tokens, strict=True):
        out, last, itl, _ = state[req.rid]
        out.append(tok)
        if last is not None:
            itl.append(now - last)
        state[req.rid][1] = now
        params = req.sampling_params
        if len(out) >= params.max_new_tokens or params.stop_token_ids or tok == eos:
            maybe.append(req)
    return maybe


@pytest.mark.parametrize("seed", range(4))
def test_times_gaps_and_finish_candidates_match_per_request_stamping(seed, monkeypatch):
    monkeypatch.setattr(decode_tokens, "TIME_LOG_STEPS", 7)  # the log is cut during the run
    rng = random.Random(seed)
    run = DecodeTokens()
    reqs, state = [], {}
    for i in range(10):
        params = SamplingParams(
            max_new_tokens=rng.randint(2, 40), stop_token_ids=(5,) if i % 4 == 0 else ()
        )
        req = Req(rid=f"r{i}", origin_input_ids=[1], sampling_params=params)
        req.output_ids.append(3)
        req.last_token_time = 0.5 * i
        reqs.append(req)
        state[req.rid] = [list(req.output_ids), req.last_token_time, [], None]
    running, now, done = reqs[:6], 10.0, set()
    for _ in range(60):
        if rng.random() < 0.15 and len(running) > 1:
            running.pop(rng.randrange(len(running)))
        waiting = [r for r in reqs if r not in running and r not in done]
        if waiting and rng.random() < 0.15:
            back = rng.choice(waiting)
            now += 0.25  # re-prefilled: a token stamped outside any decode step
            back.output_ids.append(4)
            back.itl.append(now - back.last_token_time)
            back.last_token_time = now
            out, last, itl, _ = state[back.rid]
            out.append(4)
            itl.append(now - last)
            state[back.rid][1] = now
            running.insert(rng.randrange(len(running) + 1), back)
        if rng.random() < 0.2:
            probe = rng.choice(reqs)
            assert (probe.last_token_time, probe.itl) == tuple(state[probe.rid][1:3])
        now += rng.choice([0.01, 0.02, 0.5])
        tokens = [rng.choice([7, 8, 5, EOS]) for _ in running]
        if rng.random() < 0.3:  # a decode run asks first: the batch is regrouped there
            quiet = run.quiet_steps(running)
            stoppers = any(r.sampling_params.stop_token_ids for r in running)
            left = min(r.sampling_params.max_new_tokens - len(r.output_ids) for r in running)
            assert quiet == (0 if stoppers else min(left - 1, decode_tokens.TIME_LOG_STEPS))
        maybe = run.advance(running, tokens, now, EOS)
        assert maybe == reference_step(state, running, tokens, now, EOS)
        for req in maybe:  # done at its length limit: it leaves, as the processor makes it
            if len(req.output_ids) >= req.sampling_params.max_new_tokens:
                run.leave(req)
                running.remove(req)
                done.add(req)
        if not running:
            break
    for req in reqs:
        out, last, itl, _ = state[req.rid]
        assert (req.output_ids, req.last_token_time, req.itl) == (out, last, itl)


def test_without_a_clock_only_tokens_and_finish_candidates_are_kept():
    run = DecodeTokens()
    req = Req(rid="a", origin_input_ids=[1], sampling_params=SamplingParams(max_new_tokens=3))
    assert run.advance([req], [1], None, None) == []
    assert run.advance([req], [2], None, None) == []
    assert run.advance([req], [3], None, None) == [req]
    assert req.output_ids == [1, 2, 3] and req.itl == [] and req.time_run is None


def test_a_request_that_leaves_is_let_go():
    run = DecodeTokens()
    a = Req(rid="a", origin_input_ids=[1], sampling_params=SamplingParams(max_new_tokens=50))
    b = Req(rid="b", origin_input_ids=[1], sampling_params=SamplingParams(max_new_tokens=50))
    run.advance([a, b], [1, 1], 1.0, None)
    run.leave(a)
    assert a not in run and a.time_run is None and a.last_token_time == 1.0
    assert all(a not in filed for filed in run._due.values())
    run.advance([b], [2], 2.0, None)
    assert a.output_ids == [1] and b.output_ids == [1, 2] and b.itl == [1.0]
