"""The llama3-8b / h100 preset against step times built from measured kernel times.

Method. The reference step time of a forward pass is the sum of measured operator times:

- Linear layers, norms, rope and the embedding: Vidur's public H100 profile of Llama-2-7B
  (github.com/microsoft/vidur, data/profiling/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv,
  tensor parallel 1, the median of each operator; the columns kept are in
  benchmarks/data/vidur_h100_llama2_7b_ops.csv), scaled to Llama-3-8B's shape operator by
  operator: the QKV projection by its output width (4096 + 2 x 1024 against 3 x 4096: x0.5),
  rope by the rotated width (x0.625), the MLP projections and activation by the intermediate
  size (14336 / 11008), the rest unchanged; times 32 layers plus one embedding. Between the
  profiled token counts (1 to 4,096) times are interpolated; above 4,096 the per-token slope of
  2,048-4,096 carries on.
- The LM head (not in Vidur's profile): 128,256 x 4,096 bf16 weights read once per step, and
  its FLOPs for each request's last token, at the bandwidth and matmul rates the profile shows
  for the MLP projection (``MEASURED_BANDWIDTH``, ``MEASURED_MATMUL``).
- Prefill attention: the causal pairs of each chunk (new x prefix + new x (new + 1) / 2) x 4 x
  layers x heads x head_dim FLOPs at FlashAttention-3's BF16 forward rate for head dim 128 on
  an H100 SXM5 (Shah et al. 2024, arXiv:2407.08608, Fig. 5), interpolated by sequence length;
  FlashAttention-2's rates from the same figure give the upper column.
- Decode attention: each request's KV (128 KiB a token) read once at ``MEASURED_BANDWIDTH``.

Prompts longer than SGLang's default chunk (8,192 tokens) run as chunks, each a step. The
preset's time is the simulated runner's own cost functions without the scheduler's CPU
overheads (which are not GPU time). Each row prints the reference, the preset and their ratio;
the script exits 1 when a ratio leaves 1 +- ``TOLERANCE``. Deterministic (no timing here).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import sys
from pathlib import Path

from schedkit.core.schedule_batch import ForwardMode, Req, SamplingParams, ScheduleBatch
from schedkit.runner import presets
from schedkit.runner.calibrate import Step, fit
from schedkit.runner.model_runner import SimulatedModelRunner

DATA = Path(__file__).resolve().parent / "data" / "vidur_h100_llama2_7b_ops.csv"
TOLERANCE = 0.15
CHUNK = 8192
LAYERS, HEADS, HEAD_DIM, VOCAB, HIDDEN = 32, 32, 128, 128256, 4096
KV_BYTES_PER_TOKEN = 2 * LAYERS * 8 * HEAD_DIM * 2
# Llama-2-7B -> Llama-3-8B operator scales (see the module docstring).
SCALES = {
    "input_layernorm": 1.0,
    "attn_pre_proj": (4096 + 2 * 1024) / (3 * 4096),
    "attn_rope": (4096 + 1024) / (2 * 4096),
    "attn_post_proj": 1.0,
    "post_attention_layernorm": 1.0,
    "mlp_up_proj": 14336 / 11008,
    "mlp_act": 14336 / 11008,
    "mlp_down_proj": 14336 / 11008,
    "add": 1.0,
}
# FlashAttention forward, head dim 128, H100 SXM5 (TFLOP/s by sequence length).
FA3 = {512: 467, 1024: 565, 2048: 625, 4096: 638, 8192: 646, 16384: 648}
FA2 = {512: 309, 1024: 350, 2048: 362, 4096: 368, 8192: 370, 16384: 370}


def _interpolate(points: dict[int, float], x: float) -> float:
    """Linear between the given points; past the last one, the slope from half its x on."""
    xs = sorted(points)
    if x <= xs[0]:
        return points[xs[0]]
    if x >= xs[-1]:
        hi = xs[-1]
        lo = xs[bisect.bisect_left(xs, hi // 2)]
    else:
        i = bisect.bisect_right(xs, x)
        lo, hi = xs[i - 1], xs[i]
    return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)


def _rate(table: dict[int, float], seqlen: float) -> float:
    return min(_interpolate(table, seqlen), max(table.values())) * 1e12


def load_ops(path: Path = DATA) -> tuple[dict[int, float], dict[int, float]]:
    """Per-token-count times in seconds: the scaled layer stack plus embedding, and the MLP
    up-projection alone (to read the achieved bandwidth and matmul rate)."""
    stack, up = {}, {}
    with path.open() as f:
        for row in csv.DictReader(f):
            n = int(row["num_tokens"])
            layer = sum(float(row[f"{op}_ms"]) * scale for op, scale in SCALES.items())
            stack[n] = (LAYERS * layer + float(row["emb_ms"])) / 1e3
            up[n] = float(row["mlp_up_proj_ms"]) / 1e3
    return stack, up


STACK, UP = load_ops()
# The up projection (4096 x 2 x 11008 bf16) at one token reads its weights; at 4,096 tokens it
# is compute-bound: the rates it achieves stand for the LM head's.
MEASURED_BANDWIDTH = 4096 * 2 * 11008 * 2 / UP[1]
MEASURED_MATMUL = 2 * 4096 * 2 * 11008 * 4096 / UP[4096]


def linear(n: int) -> float:
    """The layer stack and embedding for ``n`` tokens, in seconds."""
    return _interpolate(STACK, n)


def lm_head(rows: int) -> float:
    """The LM head over ``rows`` tokens: its weight read or its FLOPs, whichever is longer."""
    return max(VOCAB * HIDDEN * 2 / MEASURED_BANDWIDTH, 2 * VOCAB * HIDDEN * rows / MEASURED_MATMUL)


def prefill_reference(prompt: int, table: dict[int, float] = FA3) -> list[float]:
    """Step times of a ``prompt``-token prefill, one per chunk."""
    steps, done = [], 0
    while done < prompt:
        new = min(CHUNK, prompt - done)
        pairs = new * done + new * (new + 1) // 2
        flops = 4 * LAYERS * HEADS * HEAD_DIM * pairs
        steps.append(linear(new) + lm_head(1) + flops / _rate(table, done + new))
        done += new
    return steps


def decode_reference(batch: int, context: int) -> float:
    """One decode step of ``batch`` requests with ``context`` tokens each."""
    kv = batch * context * KV_BYTES_PER_TOKEN / MEASURED_BANDWIDTH
    return linear(batch) + lm_head(batch) + kv


def reference_steps() -> list[Step]:
    """The measured-kernel steps the llama3-8b / h100 preset is fitted to: single-chunk
    prefills of 256 to 8,192 tokens, 8,192-token chunks after 8k to 24k of prefix, and decode
    batches of 1 to 256 at 1k, 2k and 4k of context."""
    steps = []
    for prompt in (256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384, 24576, 32768):
        prefix = prompt - min(prompt, CHUNK)
        new = prompt - prefix
        pairs = new * prefix + new * (new + 1) // 2
        time = prefill_reference(prompt)[-1]
        steps.append(
            Step(
                mode="prefill", batch_size=1, new_tokens=new, attention_pairs=pairs, step_time=time
            )
        )
    for context in (1024, 2048, 4096):
        for batch in (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256):
            steps.append(
                Step(
                    mode="decode",
                    batch_size=batch,
                    context_tokens=batch * context,
                    step_time=decode_reference(batch, context),
                )
            )
    return steps


def fitted_coefficients() -> dict[str, float]:
    """The cost-model coefficients that fit ``reference_steps`` best, to 4 digits."""
    result = fit(reference_steps())
    return {
        term: float(f"{value:.4g}")
        for mode in result.modes.values()
        for term, value in mode.coefficients.items()
    }


def _req(rid: str, prompt: int, output: int) -> Req:
    return Req(
        rid=rid,
        origin_input_ids=[1] * prompt,
        output_ids=[1] * output,
        sampling_params=SamplingParams(max_new_tokens=output + 1),
    )


def preset_runner() -> SimulatedModelRunner:
    """The simulated runner with the llama3-8b / h100 preset, CPU overheads left out."""
    args = presets.runner_args(presets.model("llama3-8b"), presets.gpu("h100"))
    args.update(step_overhead=0.0, request_overhead=0.0)
    return SimulatedModelRunner(**args)


def prefill_preset(runner: SimulatedModelRunner, prompt: int) -> list[float]:
    """The preset's step times of a ``prompt``-token prefill, chunked as SGLang chunks it."""
    steps, done = [], 0
    while done < prompt:
        new = min(CHUNK, prompt - done)
        batch = ScheduleBatch(
            reqs=[_req("p", prompt, 0)],
            forward_mode=ForwardMode.EXTEND,
            prefix_lens=[done],
            extend_lens=[new],
        )
        steps.append(runner.prefill_cost(batch))
        done += new
    return steps


def rows() -> list[tuple[str, float, float, float]]:
    """(case, reference FA3, reference FA2, preset) step times in seconds."""
    runner = preset_runner()
    out = []
    for prompt in (1024, 2048, 4096, 8192, 16384, 32768):
        out.append(
            (
                f"prefill {prompt // 1024}k tokens",
                sum(prefill_reference(prompt)),
                sum(prefill_reference(prompt, FA2)),
                sum(prefill_preset(runner, prompt)),
            )
        )
    for context in (1024, 4096):
        for batch in (1, 8, 32, 64, 128, 256):
            reqs = [_req(str(i), context - 1, 1) for i in range(batch)]
            ref = decode_reference(batch, context)
            out.append(
                (
                    f"decode batch {batch}, {context // 1024}k context",
                    ref,
                    ref,
                    runner.decode_cost(reqs),
                )
            )
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the comparison; exit 1 if any case is off by more than the tolerance."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    print(f"{'case':<30} {'FA3 ms':>9} {'FA2 ms':>9} {'preset ms':>10} {'preset/FA3':>11}")
    worst = 0.0
    for case, fa3, fa2, preset in rows():
        ratio = preset / fa3
        worst = max(worst, abs(ratio - 1))
        print(f"{case:<30} {fa3 * 1e3:9.2f} {fa2 * 1e3:9.2f} {preset * 1e3:10.2f} {ratio:11.3f}")
    print(f"largest deviation {worst:.1%} (tolerance {TOLERANCE:.0%})")
    print("fitted:", ", ".join(f"{k} {v:.4g}" for k, v in fitted_coefficients().items()))
    for mode in fit(reference_steps()).modes.values():
        print(f"fit error {mode.mode}: mean {mode.mean_relative_error:.1%} over {mode.rows} steps")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
