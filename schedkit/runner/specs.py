"""Model and GPU specs the presets are built from: a model's shape and a GPU's datasheet.

Models (bf16 weights and KV; the shape from each model's ``config.json`` on the Hugging Face
hub: llama3-8b meta-llama/Meta-Llama-3-8B, llama3-70b meta-llama/Meta-Llama-3-70B, qwen2.5-7b
Qwen/Qwen2.5-7B-Instruct, mistral-7b mistralai/Mistral-7B-v0.3)::

    name         layers  hidden  heads  kv_heads  head_dim  intermediate  vocab   context  TP
    llama3-8b    32      4096    32     8         128       14336         128256  8192     1
    llama3-70b   80      8192    64     8         128       28672         128256  8192     4 (or 8)
    qwen2.5-7b   28      3584    28     4         128       18944         152064  32768    1
    mistral-7b   32      4096    32     8         128       14336         32768   32768    1

``vocab`` is ``vocab_size`` and ``context`` is ``max_position_embeddings`` (none of the four
sets ``rope_scaling``, so it is the context length SGLang derives, ``model_config.context_len``).

``head_dim`` is ``hidden / heads`` for all four. Parameters are counted from the shape
(embeddings and LM head untied, SwiGLU MLP, norms; Qwen's q/k/v biases are left out): 8.03 B,
70.55 B, 7.62 B, 7.25 B, the figures the model cards give.

GPUs (vendors' datasheets; dense BF16 tensor-core throughput, not the "with sparsity" figure;
memory read as GiB, as CUDA reports it)::

    name      datasheet                          memory     bandwidth   BF16 dense
    h100      NVIDIA H100 SXM5 80GB              80 GiB     3.35 TB/s   989.5 TFLOP/s
    h200      NVIDIA H200 SXM 141GB              141 GiB    4.8 TB/s    989.5 TFLOP/s
    a100-80g  NVIDIA A100 SXM4 80GB              80 GiB     2.039 TB/s  312 TFLOP/s
    l40s      NVIDIA L40S                        48 GiB     0.864 TB/s  362.05 TFLOP/s
"""

from __future__ import annotations

import attrs

__all__ = ["GPUS", "MODELS", "GpuSpec", "ModelSpec", "PresetError", "gpu", "model"]

_GIB = 1 << 30


class PresetError(ValueError):
    """An unknown preset name, or a model and GPU that do not fit together."""


@attrs.frozen(kw_only=True)
class ModelSpec:
    """A decoder-only transformer's shape, as its ``config.json`` gives it."""

    name: str
    source: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    context_length: int
    default_tp: int = 1

    @property
    def params(self) -> int:
        """Parameter count: embeddings, LM head, attention, SwiGLU MLP and norms."""
        attention = 2 * self.hidden * self.heads * self.head_dim
        attention += 2 * self.hidden * self.kv_heads * self.head_dim
        layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * layer + 2 * self.vocab * self.hidden + self.hidden

    @property
    def layer_matmul_params(self) -> int:
        """Parameters of the layers' matmuls (attention projections and MLP), which every
        token goes through."""
        attention = 2 * self.hidden * (self.heads + self.kv_heads) * self.head_dim
        return self.layers * (attention + 3 * self.hidden * self.intermediate)


@attrs.frozen(kw_only=True)
class GpuSpec:
    """A GPU's memory, memory bandwidth and dense BF16 throughput, from its datasheet."""

    name: str
    source: str
    memory_gib: float
    bandwidth: float  # bytes/s
    bf16_flops: float  # FLOP/s, dense

    @property
    def memory_bytes(self) -> float:
        """The memory in bytes (``memory_gib`` x 2**30)."""
        return self.memory_gib * _GIB


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            name="llama3-8b",
            source="meta-llama/Meta-Llama-3-8B",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            intermediate=14336,
            vocab=128256,
            context_length=8192,
        ),
        ModelSpec(
            name="llama3-70b",
            source="meta-llama/Meta-Llama-3-70B",
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            head_dim=128,
            intermediate=28672,
            vocab=128256,
            context_length=8192,
            default_tp=4,
        ),
        ModelSpec(
            name="qwen2.5-7b",
            source="Qwen/Qwen2.5-7B-Instruct",
            layers=28,
            hidden=3584,
            heads=28,
            kv_heads=4,
            head_dim=128,
            intermediate=18944,
            vocab=152064,
            context_length=32768,
        ),
        ModelSpec(
            name="mistral-7b",
            source="mistralai/Mistral-7B-v0.3",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            intermediate=14336,
            vocab=32768,
            context_length=32768,
        ),
    )
}

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            name="h100",
            source="NVIDIA H100 SXM5 80GB",
            memory_gib=80,
            bandwidth=3.35e12,
            bf16_flops=989.5e12,
        ),
        GpuSpec(
            name="h200",
            source="NVIDIA H200 SXM 141GB",
            memory_gib=141,
            bandwidth=4.8e12,
            bf16_flops=989.5e12,
        ),
        GpuSpec(
            name="a100-80g",
            source="NVIDIA A100 SXM4 80GB",
            memory_gib=80,
            bandwidth=2.039e12,
            bf16_flops=312e12,
        ),
        GpuSpec(
            name="l40s",
            source="NVIDIA L40S",
            memory_gib=48,
            bandwidth=0.864e12,
            bf16_flops=362.05e12,
        ),
    )
}


def model(name: str) -> ModelSpec:
    """The model preset ``name``; ``PresetError`` naming the valid ones otherwise."""
    if name not in MODELS:
        raise PresetError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}")
    return MODELS[name]


def gpu(name: str) -> GpuSpec:
    """The GPU preset ``name``; ``PresetError`` naming the valid ones otherwise."""
    if name not in GPUS:
        raise PresetError(f"unknown GPU {name!r}; valid GPUs: {', '.join(GPUS)}")
    return GPUS[name]
