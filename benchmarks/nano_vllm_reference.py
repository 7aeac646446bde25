"""nano-vllm's scheduler on the same workload as ours, with a zero-cost model.

nano-vllm is not a dependency: pass the directory of a nano-vllm checkout (the one holding the
``nanovllm`` package) and have ``xxhash`` and ``numpy`` installed, which its block manager
imports. Only ``nanovllm.engine`` (scheduler, block manager, sequence) and
``nanovllm.sampling_params`` are loaded; ``nanovllm/__init__.py`` and ``nanovllm.config`` are
skipped because they import torch and transformers. The scheduler reads its settings from a
plain namespace with the fields of nano-vllm's ``Config`` that its schedulers read (a version
that reads another is reported as not measurable).

Measured against nano-vllm commit ``NANO_VLLM_COMMIT`` (its chunked-prefill scheduler, whose
``postprocess(seqs, token_ids, is_prefill)`` takes the step's kind); a checkout whose
``postprocess`` lacks ``is_prefill`` (older) is reported as not measurable.

The loop is nano-vllm's ``LLMEngine.step`` without the model: ``schedule()``, one token per
scheduled sequence, ``postprocess()``, until every sequence has finished. Preemptions are
counted (``Scheduler.preempt`` wrapped) so that a caller can check that none happened.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
import types
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "NANO_VLLM_COMMIT",
    "NanoVllmRun",
    "NanoVllmUnavailable",
    "load_nano_vllm",
    "run_nano_vllm",
]

NANO_VLLM_COMMIT = "bb823b3e06983d71485a8e1f23715ebd87d98ef8"


class NanoVllmUnavailable(RuntimeError):
    """The given directory does not hold a usable nano-vllm, or what it imports is missing."""


class NanoVllmRun(NamedTuple):
    """What one run of nano-vllm's scheduler did."""

    cpu: float
    tokens: int
    decode_steps: int
    preemptions: int


def load_nano_vllm(checkout: str | Path) -> dict[str, Any]:
    """Import nano-vllm's ``Scheduler``, ``Sequence`` and ``SamplingParams`` from ``checkout``."""
    package_dir = Path(checkout).resolve() / "nanovllm"
    if not (package_dir / "engine" / "scheduler.py").is_file():
        raise NanoVllmUnavailable(
            f"{checkout}: no nanovllm/engine/scheduler.py there; pass the directory of a "
            "nano-vllm checkout (the one holding the nanovllm package)"
        )
    for module in ("xxhash", "numpy"):
        try:
            importlib.import_module(module)
        except ImportError:
            raise NanoVllmUnavailable(
                f"nano-vllm's block manager imports {module}: pip install xxhash numpy"
            ) from None
    package = types.ModuleType("nanovllm")
    package.__path__ = [str(package_dir)]
    config = types.ModuleType("nanovllm.config")
    config.Config = types.SimpleNamespace  # the scheduler imports it for annotations only
    sys.modules.update({"nanovllm": package, "nanovllm.config": config})
    try:
        scheduler = importlib.import_module("nanovllm.engine.scheduler")
        sequence = importlib.import_module("nanovllm.engine.sequence")
        sampling = importlib.import_module("nanovllm.sampling_params")
    except ImportError as exc:
        raise NanoVllmUnavailable(f"{checkout}: importing nano-vllm failed: {exc}") from exc
    if "is_prefill" not in inspect.signature(scheduler.Scheduler.postprocess).parameters:
        raise NanoVllmUnavailable(
            f"{checkout}: this nano-vllm's Scheduler.postprocess takes no is_prefill (an older "
            f"version); check out commit {NANO_VLLM_COMMIT}"
        )
    return {
        "Scheduler": scheduler.Scheduler,
        "Sequence": sequence.Sequence,
        "SamplingParams": sampling.SamplingParams,
    }


def run_nano_vllm(
    nano: dict[str, Any],
    prompts: list[list[int]],
    output_len: int,
    *,
    block_size: int,
    pool_tokens: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> NanoVllmRun:
    """Run ``prompts`` to completion; returns the scheduler's CPU seconds, the generated tokens,
    the decode steps and the preemptions. The stand-in model (one list of tokens per step) is
    not timed."""
    nano["Sequence"].block_size = block_size
    config = types.SimpleNamespace(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=4096,
        eos=-1,
        num_kvcache_blocks=pool_tokens // block_size,
        kvcache_block_size=block_size,
        hf_config=None,
    )
    try:
        scheduler = nano["Scheduler"](config)
    except AttributeError as exc:
        raise NanoVllmUnavailable(
            f"this nano-vllm's Scheduler reads a setting the harness does not give: {exc}"
        ) from exc
    preemptions = 0
    preempt = scheduler.preempt

    def counted_preempt(seq: Any) -> None:
        nonlocal preemptions
        preemptions += 1
        preempt(seq)

    scheduler.preempt = counted_preempt
    params = nano["SamplingParams"](max_tokens=output_len, ignore_eos=True)
    seqs = [nano["Sequence"](prompt, params) for prompt in prompts]
    for seq in seqs:
        scheduler.add(seq)
    token = prompts[0][0]
    decode_steps = 0
    elapsed = 0.0
    clock = time.process_time
    while not scheduler.is_finished():
        start = clock()
        scheduled, is_prefill = scheduler.schedule()
        middle = clock()
        token_ids = [token] * len(scheduled)
        resume = clock()
        scheduler.postprocess(scheduled, token_ids, is_prefill)
        elapsed += middle - start + clock() - resume
        decode_steps += not is_prefill
    tokens = sum(seq.num_completion_tokens for seq in seqs)
    return NanoVllmRun(elapsed, tokens, decode_steps, preemptions)
