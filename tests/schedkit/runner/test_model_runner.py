import time

import pytest

from schedkit.core.component import component_name
from schedkit.core.schedule_batch import ForwardMode, Req, SamplingParams, ScheduleBatch
from schedkit.runner.model_runner import TOKEN_TABLE_SIZE, SimulatedModelRunner


def req(rid, prompt_len=10, outputs=0):
    return Req(
        rid=rid,
        origin_input_ids=list(range(prompt_len)),
        output_ids=[7] * outputs,
        sampling_params=SamplingParams(max_new_tokens=100),
    )


def decode_batch(*reqs):
    return ScheduleBatch(reqs=list(reqs), forward_mode=ForwardMode.DECODE)


def extend_batch(reqs, prefix_lens, extend_lens):
    return ScheduleBatch(
        reqs=reqs,
        forward_mode=ForwardMode.EXTEND,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
    )


def test_registered_name():
    assert component_name(SimulatedModelRunner) == "simulated_model_runner"


def test_tokens_are_deterministic_per_seed_rid_and_position():
    a, b, c = SimulatedModelRunner(seed=1), SimulatedModelRunner(seed=1), SimulatedModelRunner()
    seq_a = [a.token("r1", p) for p in range(50)]
    assert seq_a == [b.token("r1", p) for p in range(50)]
    assert seq_a != [c.token("r1", p) for p in range(50)]
    assert seq_a != [a.token("r2", p) for p in range(50)]
    assert len(set(seq_a)) > 40
    assert all(0 <= t < a.vocab_size for t in seq_a)
    # forward gives the token of the request's next output position.
    r = req("r1", outputs=3)
    assert a.forward(decode_batch(r)).next_token_ids == [seq_a[3]]


def test_extend_gives_no_token_for_a_chunk_short_of_the_end():
    runner = SimulatedModelRunner(zero_cost=True)
    full, partial = req("full", prompt_len=10), req("partial", prompt_len=10)
    result = runner.forward(extend_batch([full, partial], [4, 0], [6, 8]))
    assert result.next_token_ids == [runner.token("full", 0), None]
    assert result.elapsed == 0.0


def test_virtual_clock_advances_by_the_cost_model_without_sleeping():
    runner = SimulatedModelRunner(
        prefill_fixed=100.0,
        prefill_per_token=2.0,
        attention_coeff=0.5,
        decode_fixed=1000.0,
        decode_per_seq=10.0,
        decode_per_kv_token=0.25,
    )
    start = time.monotonic()
    r1, r2 = req("a", prompt_len=4), req("b", prompt_len=6)
    result = runner.forward(extend_batch([r1, r2], [1, 0], [3, 6]))
    # 100 + 2 * 9 + 0.5 * causal pairs ((3 * 1 + 3 * 4 / 2) + (6 * 0 + 6 * 7 / 2))
    assert result.elapsed == 133.0
    assert runner.now() == 133.0
    r1.output_ids.append(1)
    r2.output_ids += [1, 2]
    result = runner.forward(decode_batch(r1, r2))
    # 1000 + 10 * 2 + 0.25 * (5 + 8)
    assert result.elapsed == 1023.25
    assert runner.now() == 1156.25
    assert time.monotonic() - start < 1.0


def test_zero_cost_makes_every_step_free():
    runner = SimulatedModelRunner(zero_cost=True)
    runner.forward(extend_batch([req("a")], [0], [10]))
    runner.forward(decode_batch(req("a", outputs=1)))
    assert runner.now() == 0.0
    zeros = SimulatedModelRunner(
        prefill_fixed=0,
        prefill_per_token=0,
        attention_coeff=0,
        decode_fixed=0,
        decode_per_seq=0,
        decode_per_kv_token=0,
    )
    zeros.forward(decode_batch(req("a", outputs=1)))
    assert zeros.now() == 0.0


def test_default_coefficients_give_measured_8b_h100_step_times():
    # Step times built from measured kernels (benchmarks/presets_vs_measured.py): decode of one
    # 1k request 6.4 ms, of 256 at ~640 tokens ~18 ms, a 512-token prefill ~13 ms.
    runner = SimulatedModelRunner()
    one = runner.decode_cost([req("a", prompt_len=1000)])
    assert 0.006 < one < 0.0066
    big = runner.decode_cost([req(str(i), prompt_len=640) for i in range(256)])
    assert 0.016 < big < 0.02
    prefill = runner.prefill_cost(extend_batch([req("a", prompt_len=512)], [0], [512]))
    assert 0.012 < prefill < 0.015


def test_wait_until_moves_the_clock_forward_only():
    virtual = SimulatedModelRunner()
    start = time.monotonic()
    virtual.wait_until(500.0)
    assert virtual.now() == 500.0
    virtual.wait_until(100.0)
    assert virtual.now() == 500.0
    assert time.monotonic() - start < 1.0
    wall = SimulatedModelRunner(clock="wall")
    target = wall.now() + 0.02
    wall.wait_until(target)
    assert wall.now() >= target


def test_wall_clock_sleeps_the_modelled_time():
    runner = SimulatedModelRunner(clock="wall", decode_fixed=0.03, decode_per_seq=0.0)
    before = runner.now()
    start = time.monotonic()
    result = runner.forward(decode_batch(req("a", outputs=1)))
    assert time.monotonic() - start >= 0.03
    assert result.elapsed >= 0.03
    assert runner.now() - before >= 0.03


def test_no_eos_unless_chosen():
    runner = SimulatedModelRunner(vocab_size=4, eos_token_id=2)
    tokens = [runner.token(f"r{i}", p) for i in range(20) for p in range(50)]
    assert 2 not in tokens
    assert set(tokens) == {0, 1, 3}


def test_eos_probability_sets_the_fraction_of_eos_tokens():
    runner = SimulatedModelRunner(eos_token_id=0, eos_probability=0.25)
    tokens = [runner.token("r", p) for p in range(TOKEN_TABLE_SIZE)]
    assert tokens.count(0) == TOKEN_TABLE_SIZE // 4
    again = SimulatedModelRunner(eos_token_id=0, eos_probability=0.25)
    assert tokens == [again.token("r", p) for p in range(TOKEN_TABLE_SIZE)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clock": "cpu"}, "clock must be"),
        ({"vocab_size": 1}, "vocab_size"),
        ({"eos_token_id": 32000}, "eos_token_id"),
        ({"eos_probability": 0.5}, "needs an eos_token_id"),
        ({"eos_token_id": 1, "eos_probability": 1.5}, "eos_probability"),
        ({"decode_fixed": -1.0}, "decode_fixed"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimulatedModelRunner(**kwargs)


def test_decode_tokens_do_not_depend_on_which_rids_were_seen_before(monkeypatch):
    import schedkit.runner.model_runner as model_runner

    monkeypatch.setattr(model_runner, "_MAX_CACHED_RIDS", 3)  # forget rids often
    runner, fresh = SimulatedModelRunner(seed=5), SimulatedModelRunner(seed=5)
    reqs = [req(f"r{i}", outputs=i) for i in range(5)]
    expected = [fresh.token(r.rid, len(r.output_ids)) for r in reqs]
    for _ in range(3):  # first with unseen rids, then from the (cleared) rid table
        assert runner.forward(decode_batch(*reqs)).next_token_ids == expected
    assert len(runner._offsets) <= 3


def test_scheduler_overhead_is_added_per_step_and_per_request():
    plain = SimulatedModelRunner()
    loaded = SimulatedModelRunner(step_overhead=1e-4, request_overhead=5e-6)
    reqs = [req(str(i), prompt_len=100) for i in range(10)]
    assert loaded.decode_cost(reqs) == pytest.approx(plain.decode_cost(reqs) + 1e-4 + 10 * 5e-6)
    batch = extend_batch(reqs[:3], [0, 0, 0], [100, 100, 100])
    assert loaded.prefill_cost(batch) == pytest.approx(plain.prefill_cost(batch) + 1e-4 + 3 * 5e-6)
    free = SimulatedModelRunner(zero_cost=True, step_overhead=1.0, request_overhead=1.0)
    assert free.forward(decode_batch(*reqs)).elapsed == 0.0


@pytest.mark.parametrize("name", ["step_overhead", "request_overhead"])
def test_negative_overhead_is_refused(name):
    with pytest.raises(ValueError, match=f"{name} must be >= 0"):
        SimulatedModelRunner(**{name: -1e-6})


def test_transfer_seconds_are_added_to_prefill_steps_only():
    pending = [0.25, 0.5]
    runner = SimulatedModelRunner(
        prefill_fixed=1.0,
        prefill_per_token=0.0,
        attention_coeff=0.0,
        decode_fixed=2.0,
        decode_per_seq=0.0,
        decode_per_kv_token=0.0,
        transfer_seconds=lambda: pending.pop(0),
    )
    r = req("a", prompt_len=4)
    assert runner.forward(extend_batch([r], [0], [4])).elapsed == 1.25
    r.output_ids.append(1)
    assert runner.forward(decode_batch(r)).elapsed == 2.0
    assert pending == [0.5]
    free = SimulatedModelRunner(zero_cost=True, transfer_seconds=lambda: pending.pop(0))
    assert free.forward(extend_batch([req("b", prompt_len=4)], [0], [4])).elapsed == 0.0


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"decode_per_kv_token": 0.0},
        {"zero_cost": True},
        {"eos_token_id": 3, "eos_probability": 0.01},
    ],
    ids=["default", "no-kv-term", "zero-cost", "eos"],
)
def test_a_decode_run_gives_the_times_and_tokens_of_a_forward_per_step(settings):
    stop = settings.get("eos_token_id")
    for until in (0.0, 0.0137, 0.25, 3.0, float("inf")):
        for origin in (0.0, 1.5):
            stepped = SimulatedModelRunner(seed=4, step_overhead=1e-4, **settings)
            run = SimulatedModelRunner(seed=4, step_overhead=1e-4, **settings)
            for runner in (stepped, run):
                runner.wait_until(origin + 0.01)
            reqs = [req(f"r{i}", prompt_len=100 * i + 7, outputs=i) for i in range(5)]
            copies = [req(f"r{i}", prompt_len=100 * i + 7, outputs=i) for i in range(5)]
            times, tokens = run.forward_decode_run(reqs, 300, until, origin, stop)
            expected_times, expected_tokens = [], [[] for _ in copies]
            while len(expected_times) < 300 and stepped.now() - origin < until:
                step = stepped.forward(decode_batch(*copies)).next_token_ids
                if stop in step:
                    break
                expected_times.append(stepped.now())
                for column, output, token in zip(expected_tokens, copies, step, strict=True):
                    column.append(token)
                    output.output_ids.append(token)
            assert times == expected_times  # the same floats
            assert tokens == (expected_tokens if times else [])
            assert run.now() == (times[-1] if times else origin + 0.01)
    assert 0 < len(times) < 300 if stop is not None else len(times) == 300
