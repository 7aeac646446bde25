import pytest

from schedkit import load_wiring
from schedkit.runner import presets
from schedkit.runner.model_runner import SimulatedModelRunner
from schedkit.runner.presets import (
    FITTED_COEFFICIENTS,
    GPUS,
    MODELS,
    PresetError,
    kv_pool_tokens,
    runner_args,
)

ROOT_WIRING = "wiring.yaml"


def test_llama3_8b_kv_bytes_and_pool_on_one_h100():
    m, g = MODELS["llama3-8b"], GPUS["h100"]
    assert presets.kv_bytes_per_token(m) == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    pool = kv_pool_tokens(m, g, page_size=16)
    assert pool % 16 == 0
    # (80 GiB * 0.88 - 8.03e9 * 2 bytes) / 128 KiB
    assert pool == pytest.approx((80 * 2**30 * 0.88 - 16.06e9) / 131072, rel=1e-3)
    assert 440_000 < pool < 460_000


def test_tensor_parallelism_splits_weights_and_kv_heads():
    m, g = MODELS["llama3-70b"], GPUS["h100"]
    assert presets.kv_bytes_per_token(m, 8) == 2 * 80 * 1 * 128 * 2
    # 16 ways: 8 KV heads are replicated, one per GPU, as SGLang does.
    assert presets.kv_bytes_per_token(m, 16) == presets.kv_bytes_per_token(m, 8)
    four, eight = runner_args(m, g, 4), runner_args(m, g, 8)
    for key in ("decode_fixed", "decode_per_seq", "attention_coeff", "decode_per_kv_token"):
        assert eight[key] == pytest.approx(four[key] / 2, rel=1e-3)
    assert kv_pool_tokens(m, g, 8) > 2 * kv_pool_tokens(m, g, 4)


def test_coefficients_follow_bandwidth_and_compute():
    m = MODELS["llama3-8b"]
    h100, h200, a100 = (runner_args(m, GPUS[g]) for g in ("h100", "h200", "a100-80g"))
    # the fitted pair carries the fit; memory-bound terms scale with bandwidth, compute-bound
    # terms with FLOP/s
    assert {k: h100[k] for k in FITTED_COEFFICIENTS} == FITTED_COEFFICIENTS
    assert h200["decode_fixed"] / h100["decode_fixed"] == pytest.approx(3.35 / 4.8, rel=2e-3)
    assert h200["decode_per_seq"] == h100["decode_per_seq"]
    assert a100["prefill_per_token"] / h100["prefill_per_token"] == pytest.approx(
        989.5 / 312, rel=2e-3
    )
    assert a100["attention_coeff"] / h100["attention_coeff"] == pytest.approx(989.5 / 312, rel=2e-3)
    assert a100["decode_per_kv_token"] / h100["decode_per_kv_token"] == pytest.approx(
        3.35 / 2.039, rel=2e-3
    )
    seventy = runner_args(MODELS["llama3-70b"], GPUS["h100"], 4)
    assert seventy["prefill_per_token"] / h100["prefill_per_token"] == pytest.approx(
        MODELS["llama3-70b"].layer_matmul_params / 4 / m.layer_matmul_params, rel=2e-3
    )
    assert h100["step_overhead"] == 126e-6 and h100["request_overhead"] == 4.4e-6
    assert h100["vocab_size"] == 128256


def test_every_preset_builds_a_runner_with_plausible_step_times():
    for m in MODELS.values():
        for g in GPUS.values():
            args = runner_args(m, g, m.default_tp)
            runner = SimulatedModelRunner(**args)
            assert runner.vocab_size == m.vocab
            assert 2e-3 < args["decode_fixed"] < 0.1, (m.name, g.name)


def test_impossible_splits_say_what_is_valid():
    with pytest.raises(PresetError, match=r"cannot be split 3 ways.*valid tensor-parallel sizes"):
        runner_args(MODELS["llama3-70b"], GPUS["h100"], 3)
    with pytest.raises(PresetError, match=r"141\.1 GB of weights per GPU.*use --tp 2"):
        kv_pool_tokens(MODELS["llama3-70b"], GPUS["h100"], 1)


def test_preset_overlay_sets_the_runner_and_the_kv_pool_of_a_wiring():
    wiring = load_wiring(ROOT_WIRING)
    overlay, line = presets.preset_overlay(wiring, "qwen2.5-7b", "l40s")
    args = overlay["components"]["model_runner"]["args"]
    assert args == runner_args(MODELS["qwen2.5-7b"], GPUS["l40s"])
    size = overlay["components"]["allocator"]["args"]["size"]
    assert size == kv_pool_tokens(MODELS["qwen2.5-7b"], GPUS["l40s"], page_size=16)
    assert f"KV pool {size:,} tokens" in line and "qwen2.5-7b" in line
    merged = load_wiring(ROOT_WIRING, overlay)
    assert merged.components["allocator"].args["size"] == size
    # the defaults: llama3-8b, h100, the model's TP
    overlay, line = presets.preset_overlay(wiring, None, None)
    assert overlay["components"]["model_runner"]["args"]["vocab_size"] == 128256
    assert "llama3-8b" in line and "1 x h100" in line
    overlay, line = presets.preset_overlay(wiring, "llama3-70b", None)
    assert "4 x h100" in line


def test_preset_overlay_needs_a_simulated_runner():
    wiring = load_wiring(
        {"components": {"allocator": {"type": "token_to_kv_pool_allocator", "args": {"size": 64}}}}
    )
    with pytest.raises(PresetError, match="no component of that type"):
        presets.preset_overlay(wiring, "llama3-8b", "h100")


def test_model_limits_give_every_scheduler_the_model_context_and_vocabulary():
    wiring = load_wiring(ROOT_WIRING)
    overlay, line = presets.preset_overlay(wiring, "qwen2.5-7b", None)
    assert "scheduler" not in overlay["components"]  # off by default: trace replays unchanged
    assert "context 32,768 (model limits off)" in line
    overlay, line = presets.preset_overlay(wiring, "llama3-8b", "h100", model_limits="refuse")
    assert overlay["components"]["scheduler"]["args"] == {
        "context_length": 8192,
        "vocab_size": 128256,
        "allow_auto_truncate": False,
    }
    assert "model limits refuse from 8,186 prompt tokens" in line
    merged = load_wiring(ROOT_WIRING, overlay).components["scheduler"].args
    assert (merged["context_length"], merged["vocab_size"]) == (8192, 128256)
    overlay, _ = presets.preset_overlay(wiring, "mistral-7b", None, model_limits="truncate")
    assert overlay["components"]["scheduler"]["args"]["allow_auto_truncate"] is True
    with pytest.raises(PresetError, match="valid: off, refuse, truncate"):
        presets.preset_overlay(wiring, None, None, model_limits="clip")
    runner_only = load_wiring({"components": {"model_runner": {"type": "simulated_model_runner"}}})
    with pytest.raises(PresetError, match="set a scheduler's arguments"):
        presets.preset_overlay(runner_only, None, None, model_limits="refuse")
