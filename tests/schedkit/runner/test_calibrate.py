import math
import random

import pytest

from schedkit.core.schedule_batch import ForwardMode, Req, SamplingParams, ScheduleBatch
from schedkit.runner.calibrate import CalibrationError, Step, fit
from schedkit.runner.calibration_csv import read_steps
from schedkit.runner.model_runner import SimulatedModelRunner
from schedkit.runner.presets import GPUS, MODELS, runner_args

HEADER = "mode,batch_size,new_tokens,attention_pairs,context_tokens,step_time_ms\n"


def _req(rid: str, prompt: int, outputs: int = 0) -> Req:
    return Req(
        rid=rid,
        origin_input_ids=[1] * prompt,
        output_ids=[2] * outputs,
        sampling_params=SamplingParams(max_new_tokens=10),
    )


def measured_csv(runner: SimulatedModelRunner, rows: int, noise: float, seed: int = 0) -> str:
    """Step times the runner's own cost model gives random batches, with relative noise."""
    rng = random.Random(seed)
    lines = [HEADER]
    for i in range(rows):
        size = rng.randint(1, 4)
        prefix = [rng.choice([0, rng.randint(1, 8000)]) for _ in range(size)]
        new = [int(math.exp(rng.uniform(math.log(8), math.log(4096)))) for _ in range(size)]
        reqs = [_req(f"p{i}-{j}", p + n) for j, (p, n) in enumerate(zip(prefix, new, strict=True))]
        batch = ScheduleBatch(
            reqs=reqs, forward_mode=ForwardMode.EXTEND, prefix_lens=prefix, extend_lens=new
        )
        ms = runner.prefill_cost(batch) * 1e3 * (1 + rng.gauss(0, noise))
        pairs = sum(n * p + n * (n + 1) // 2 for p, n in zip(prefix, new, strict=True))
        lines.append(f"prefill,{size},{sum(new)},{pairs},,{ms:.6f}\n")
        size = rng.randint(1, 256)
        length = int(math.exp(rng.uniform(math.log(50), math.log(8000))))  # per step, so that
        reqs = [_req(f"d{i}-{j}", length, 5) for j in range(size)]  # context varies apart from size
        ms = runner.decode_cost(reqs) * 1e3 * (1 + rng.gauss(0, noise))
        context = sum(len(r.origin_input_ids) + len(r.output_ids) for r in reqs)
        lines.append(f"decode,{size},,,{context},{ms:.6f}\n")
    return "".join(lines)


def test_fit_recovers_the_coefficients_that_made_the_steps(tmp_path):
    truth = runner_args(MODELS["llama3-8b"], GPUS["h100"])
    runner = SimulatedModelRunner(**truth)
    path = tmp_path / "steps.csv"
    path.write_text(measured_csv(runner, rows=300, noise=0.01))
    result = fit(read_steps(path), truth["step_overhead"], truth["request_overhead"])
    for mode in result.modes.values():
        assert mode.rows == 300
        assert mode.mean_relative_error < 0.015
        for name, value in mode.coefficients.items():
            assert value == pytest.approx(truth[name], rel=0.05), name
    args = result.runner_args()
    assert (args["step_overhead"], args["request_overhead"]) == (126e-6, 4.4e-6)
    SimulatedModelRunner(**result.runner_args())  # the overlay's values build a runner


def test_exact_steps_are_fitted_exactly(tmp_path):
    runner = SimulatedModelRunner(prefill_fixed=0.004, attention_coeff=2e-9, decode_per_seq=5e-5)
    path = tmp_path / "steps.csv"
    path.write_text(measured_csv(runner, rows=20, noise=0.0))
    result = fit(read_steps(path))
    for name in ("prefill_fixed", "attention_coeff", "decode_per_seq", "decode_per_kv_token"):
        mode = "prefill" if name in ("prefill_fixed", "attention_coeff") else "decode"
        assert result.modes[mode].coefficients[name] == pytest.approx(
            getattr(runner, name), rel=1e-4
        )
    assert result.modes["decode"].rmse < 1e-8


def test_a_term_that_would_be_negative_is_left_at_zero():
    steps = [
        Step(mode="decode", batch_size=b, context_tokens=c, step_time=0.01 + 1e-4 * b - 1e-9 * c)
        for b, c in [(1, 100), (2, 9000), (8, 400), (16, 20000), (32, 3000), (64, 50000)]
    ]
    mode = fit(steps).modes["decode"]
    assert mode.zeroed == ("decode_per_kv_token",)
    assert mode.coefficients["decode_per_kv_token"] == 0.0
    assert all(v >= 0 for v in mode.coefficients.values())


def test_steps_that_cannot_separate_the_terms_are_refused():
    same_size = [
        Step(mode="decode", batch_size=4, context_tokens=c, step_time=0.01 + c * 1e-8)
        for c in (100, 200, 300, 400)
    ]
    with pytest.raises(CalibrationError, match="batch_size and context_tokens must vary"):
        fit(same_size)
    with pytest.raises(CalibrationError, match="2 prefill step"):
        fit([Step(mode="prefill", batch_size=1, new_tokens=n, step_time=0.01) for n in (1, 2)])


def test_only_the_modes_present_are_fitted(tmp_path):
    runner = SimulatedModelRunner()
    text = "".join(
        line
        for line in measured_csv(runner, rows=10, noise=0.0).splitlines(True)
        if not line.startswith("prefill")
    )
    path = tmp_path / "decode.csv"
    path.write_text(text)
    result = fit(read_steps(path))
    assert set(result.modes) == {"decode"}
    assert "prefill_fixed" not in result.runner_args()
