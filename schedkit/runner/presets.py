"""Model and GPU presets for the simulated model runner: the KV pool size, the vocabulary and
every cost-model coefficient derived from a model's shape and a GPU's datasheet.

The models' shapes and the GPUs' datasheets, with their sources, are in
``schedkit.runner.specs``.

Cost-model coefficients. llama3-8b on one h100 is fitted (least squares, non-negative, with
``schedkit.runner.calibrate.fit``) to step times built from measured kernel times:
Vidur's public H100 operator profile of Llama-2-7B scaled to Llama-3-8B's shape, the LM head
and decode KV reads at the bandwidth that profile shows (2.82 TB/s, 84% of the datasheet), and
causal prefill attention at FlashAttention-3's published H100 rates
(``benchmarks/presets_vs_measured.py`` says how, and prints the comparison). Fit error: prefill
3.8% and decode 2.0% mean relative error over 12 and 33 steps; every case of the comparison
(prefill 1k-32k tokens, decode batch 1-256 at 1k and 4k context) within 15%.
The fitted values read as rates: 21.3 us per prefill token is the layers' matmuls at 66% of
the BF16 peak, 8.14e-10 s per causal attention pair is 65% of it, a decode step's 6.14 ms is
its weight read at 2.82 TB/s plus the LM head, and a prefill chunk's fixed 2.36 ms is 41% of
that read (the rest overlaps with compute).

Every other model, GPU and tensor-parallel size is scaled from that fit, term by term, by the
model's shape and the GPU's datasheet (not measured): the fixed terms by weight bytes per GPU
over bandwidth, the per-token and per-sequence terms by matmul FLOPs per GPU over BF16 peak,
the attention term by layers x heads x head_dim per GPU over peak, the KV term by KV bytes
per token per GPU over bandwidth. Tensor-parallel all-reduce time is not modelled.

- KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x 2 bytes.
- KV pool (``allocator.size``, tokens) = (GPU memory x ``mem_fraction_static`` 0.88 - weights)
  / KV bytes per token, rounded down to whole pages. As in SGLang, the 12% left out of
  ``mem_fraction_static`` is the reserve for activations, CUDA graphs and the runtime.
  Llama-3-8B on one H100: (85.9 GB x 0.88 - 16.1 GB) / 128 KiB = 454k tokens.
- ``step_overhead`` 126 us and ``request_overhead`` 4.4 us: the scheduler's CPU time per step
  and per request in the batch, as fitted by BLIS (the Blackbox Inference Simulator,
  github.com/inference-sim/inference-sim, docs/guide/latency-models.md: beta7 per step,
  beta6 per request).

Model limits (``model_limits``, off by default): ``refuse`` gives every scheduler the
model's ``context_length`` and ``vocab_size``, so that it refuses on arrival what SGLang
refuses (a prompt at or over ``max_req_input_len``, token ids outside the vocabulary) and
clips max_new_tokens to what the context leaves; ``truncate`` cuts an over-long prompt
instead, as SGLang's ``--allow-auto-truncate``. Off, a preset is a cost model and a KV pool:
trace replays keep prompts longer than the model's context (docs/running.md says why).

To fit your own stack's measured step times, use ``schedkit calibrate``.
"""

from __future__ import annotations

from typing import Any

import attrs

from schedkit.assembly.wiring import Wiring
from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.scheduler.scheduler import Scheduler
from schedkit.runner.model_runner import SimulatedModelRunner
from schedkit.runner.specs import GPUS, MODELS, GpuSpec, ModelSpec, PresetError, gpu, model

__all__ = [
    "GPUS",
    "MODELS",
    "MODEL_LIMITS",
    "GpuSpec",
    "ModelSpec",
    "PresetError",
    "gpu",
    "kv_bytes_per_token",
    "kv_pool_tokens",
    "model",
    "preset_overlay",
    "runner_args",
    "scheduler_limits",
]

MEM_FRACTION_STATIC = 0.88
# What a preset does about the model's context and vocabulary (see the module docstring).
MODEL_LIMITS = ("off", "refuse", "truncate")
# llama3-8b on one h100, fitted to measured step times (see the module docstring).
FITTED_COEFFICIENTS = {
    "prefill_fixed": 2.356e-3,
    "prefill_per_token": 2.129e-5,
    "attention_coeff": 8.142e-10,
    "decode_fixed": 6.137e-3,
    "decode_per_seq": 1.413e-5,
    "decode_per_kv_token": 4.651e-8,
}
FITTED_MODEL, FITTED_GPU = "llama3-8b", "h100"
STEP_OVERHEAD = 126e-6
REQUEST_OVERHEAD = 4.4e-6
_BF16_BYTES = 2


def _splits(m: ModelSpec, tp: int) -> bool:
    """Whether ``tp`` GPUs can share the model's heads (KV heads split or replicated)."""
    return tp >= 1 and not m.heads % tp and not (m.kv_heads % tp and tp % m.kv_heads)


def _check_tp(m: ModelSpec, tp: int) -> None:
    if not _splits(m, tp):
        valid = [t for t in (1, 2, 4, 8, 16) if _splits(m, t)]
        raise PresetError(
            f"{m.name} cannot be split {tp} ways ({m.heads} heads, {m.kv_heads} KV heads); "
            f"valid tensor-parallel sizes: {', '.join(map(str, valid))}"
        )


def kv_bytes_per_token(m: ModelSpec, tp: int = 1) -> int:
    """KV-cache bytes one token takes on each GPU of a ``tp``-way group."""
    kv_heads = max(1, m.kv_heads // tp)
    return 2 * m.layers * kv_heads * m.head_dim * _BF16_BYTES


def kv_pool_tokens(m: ModelSpec, g: GpuSpec, tp: int = 1, page_size: int = 1) -> int:
    """Tokens of KV that fit beside the weights, SGLang's ``max_total_num_tokens``."""
    _check_tp(m, tp)
    weights = m.params * _BF16_BYTES / tp
    free = g.memory_bytes * MEM_FRACTION_STATIC - weights
    tokens = int(free // kv_bytes_per_token(m, tp)) // page_size * page_size
    if tokens < page_size:
        room = g.memory_bytes * MEM_FRACTION_STATIC - kv_bytes_per_token(m) * page_size
        fits = [
            t
            for t in (2, 4, 8, 16)
            if t > tp and _splits(m, t) and m.params * _BF16_BYTES / t < room
        ]
        hint = f"; use --tp {fits[0]}" if fits else "; use a GPU with more memory"
        raise PresetError(
            f"{m.name} at TP={tp} needs {weights / 1e9:.1f} GB of weights per GPU, leaving no "
            f"room for KV in {g.name}'s {g.memory_gib:g} GiB x {MEM_FRACTION_STATIC}{hint}"
        )
    return tokens


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def _scales(m: ModelSpec, g: GpuSpec, tp: int) -> dict[str, float]:
    """What each fitted term is proportional to, for ``m`` on ``tp`` GPUs ``g``."""
    weights = m.params * _BF16_BYTES / tp / g.bandwidth
    matmuls = m.layer_matmul_params / tp / g.bf16_flops
    return {
        "prefill_fixed": weights,
        "prefill_per_token": matmuls,
        "attention_coeff": m.layers * m.heads * m.head_dim / tp / g.bf16_flops,
        "decode_fixed": weights,
        "decode_per_seq": matmuls,
        "decode_per_kv_token": kv_bytes_per_token(m, tp) / g.bandwidth,
    }


def runner_args(m: ModelSpec, g: GpuSpec, tp: int = 1) -> dict[str, Any]:
    """The ``simulated_model_runner`` arguments for model ``m`` on ``tp`` GPUs ``g``: the
    fitted coefficients, scaled from the fitted model and GPU by shape and datasheet."""
    _check_tp(m, tp)
    mine = _scales(m, g, tp)
    fitted = _scales(MODELS[FITTED_MODEL], GPUS[FITTED_GPU], 1)
    args: dict[str, Any] = {"vocab_size": m.vocab}
    for term, value in FITTED_COEFFICIENTS.items():
        args[term] = _round(value * mine[term] / fitted[term])
    args.update(step_overhead=STEP_OVERHEAD, request_overhead=REQUEST_OVERHEAD)
    return args


def describe(m: ModelSpec, g: GpuSpec, tp: int, pool: int, model_limits: str = "off") -> str:
    """One line saying what a preset sets, for the command line."""
    kv = kv_bytes_per_token(m, tp)
    limits = model_limits
    if model_limits != "off":  # SGLang's max_req_input_len: min(context, pool) - 1 - 5
        limits += f" from {min(m.context_length, pool) - 6:,} prompt tokens"
    return (
        f"{m.name} ({m.params / 1e9:.2f} B params) on {tp} x {g.name}: KV pool {pool:,} tokens "
        f"({kv / 1024:g} KiB per token per GPU), vocab {m.vocab:,}, context "
        f"{m.context_length:,} (model limits {limits})"
    )


def scheduler_limits(m: ModelSpec, model_limits: str) -> dict[str, Any]:
    """The ``scheduler`` arguments that apply model ``m``'s context and vocabulary as SGLang
    does: ``refuse`` or ``truncate`` (an over-long prompt cut), see the module docstring."""
    if model_limits not in MODEL_LIMITS[1:]:
        raise PresetError(
            f"model limits {model_limits!r} set no scheduler arguments; valid: refuse, truncate"
        )
    return {
        "context_length": m.context_length,
        "vocab_size": m.vocab,
        "allow_auto_truncate": model_limits == "truncate",
    }


def preset_overlay(
    wiring: Wiring,
    model_name: str | None,
    gpu_name: str | None,
    tp: int | None = None,
    model_limits: str = "off",
) -> tuple[dict[str, Any], str]:
    """An overlay setting every simulated model runner of ``wiring`` and every KV allocator's
    pool to a preset (model default ``llama3-8b``, GPU default ``h100``, ``tp`` the model's
    default), with ``model_limits`` ``refuse`` or ``truncate`` every scheduler's context and
    vocabulary too, and a line describing it."""
    if model_limits not in MODEL_LIMITS:
        raise PresetError(
            f"unknown model limits {model_limits!r}; valid: {', '.join(MODEL_LIMITS)}"
        )
    m = model(model_name or "llama3-8b")
    g = gpu(gpu_name or "h100")
    tp = tp or m.default_tp
    components: dict[str, Any] = {}
    for name, spec in wiring.components.items():
        if spec.cls is not None and issubclass(spec.cls, SimulatedModelRunner):
            components[name] = {"args": runner_args(m, g, tp)}
    if not components:
        raise PresetError(
            "a model or GPU preset sets a simulated_model_runner's arguments, and the wiring "
            "has no component of that type"
        )
    pool = None
    for name, spec in wiring.components.items():
        if spec.cls is not None and issubclass(spec.cls, TokenToKVPoolAllocator):
            page_size = spec.args.get("page_size")
            if not isinstance(page_size, int):
                page_size = attrs.fields_dict(spec.cls)["page_size"].default
            pool = kv_pool_tokens(m, g, tp, page_size)
            components[name] = {"args": {"size": pool}}
    if pool is None:
        pool = kv_pool_tokens(m, g, tp)
    if model_limits != "off":
        schedulers = [
            name
            for name, spec in wiring.components.items()
            if spec.cls is not None and issubclass(spec.cls, Scheduler)
        ]
        if not schedulers:
            raise PresetError(
                f"model limits {model_limits!r} set a scheduler's arguments, and the wiring "
                "has no component of that type"
            )
        for name in schedulers:
            components[name] = {"args": scheduler_limits(m, model_limits)}
    return {"components": components}, describe(m, g, tp, pool, model_limits)
