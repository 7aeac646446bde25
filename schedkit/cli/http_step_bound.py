"""The bound on one prefill step of ``schedkit serve --http``, from the cost model.

The scheduler, as SGLang's, never interrupts a step: a request that arrives while another
key's prefill chunk runs waits for it. So that a small request behind another key's flood
stays within twice its idle latency, the front end's wiring bounds the modelled time of a
prefill step (the scheduler's ``max_prefill_step_seconds`` with the model runner's
``prefill_seconds``; ``components/scheduler/prefill_step_bound.py``) to two decode steps of one
request at idle, by the simulated runner's own coefficients. For llama3-8b on one H100 that is
12.3 ms: 448 fresh tokens at the start of a prompt, 192 at 32k tokens deep (SGLang's default
8,192-token chunk costs ~215 ms at the start). The price is prefill throughput: each step
pays the fixed prefill cost for fewer tokens.

``--http-prefill-step`` sets it: ``auto`` (that bound), ``off`` (none: the wiring's token
bounds alone), or a number of milliseconds.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from schedkit.assembly.wiring import Ref, Wiring
from schedkit.runner.model_runner import TIME_TERMS, SimulatedModelRunner

__all__ = ["idle_decode_seconds", "parse_prefill_step", "prefill_step_overlay"]

# A prefill step may cost this many decode steps of one request at idle.
DECODE_STEPS = 2


def parse_prefill_step(text: str) -> str | float:
    """``--http-prefill-step``: ``auto``, ``off`` or milliseconds > 0 (returned in seconds)."""
    if text in ("auto", "off"):
        return text
    try:
        ms = float(text)
    except ValueError:
        ms = float("nan")
    if not ms > 0 or ms == float("inf"):
        raise argparse.ArgumentTypeError(f"expected auto, off or milliseconds > 0; got {text!r}")
    return ms / 1e3


def cost_model(runner_args: Mapping[str, object]) -> SimulatedModelRunner:
    """A simulated runner with the wiring's cost coefficients (the rest at their defaults)."""
    return SimulatedModelRunner(**{k: runner_args[k] for k in TIME_TERMS if k in runner_args})


def idle_decode_seconds(runner: SimulatedModelRunner) -> float:
    """The modelled time of a decode step of one request with no context."""
    return (
        runner.decode_fixed + runner.step_overhead + runner.decode_per_seq + runner.request_overhead
    )


def _tokens_within(runner: SimulatedModelRunner, seconds: float, prefix: int, page: int) -> int:
    tokens = page
    while runner.prefill_seconds(tokens + page, prefix) <= seconds and tokens < 1 << 20:
        tokens += page
    return tokens


def prefill_step_overlay(
    setting: str | float, wiring: Wiring, context_length: int
) -> tuple[dict | None, str]:
    """The overlay bounding the scheduler's prefill step for ``setting`` (None when nothing
    changes), and a line saying what was chosen."""
    if setting == "off":
        return None, "prefill steps bounded by the wiring's tokens only (--http-prefill-step off)"
    runner = wiring.components.get("model_runner")
    if runner is None or runner.type != "simulated_model_runner":
        return None, (
            "prefill steps bounded by the wiring's tokens only: the model runner has no "
            "prefill_seconds to bound a step's time by"
        )
    model = cost_model(runner.args)
    if runner.args.get("zero_cost"):
        return None, "prefill steps bounded by the wiring's tokens only (the steps are free)"
    if isinstance(setting, float):
        seconds, why = setting, "as --http-prefill-step set"
    else:
        seconds = DECODE_STEPS * idle_decode_seconds(model)
        why = f"{DECODE_STEPS} decode steps at idle"
    allocator = wiring.components.get("allocator")
    page = allocator.args.get("page_size", 1) if allocator else 1
    first = _tokens_within(model, seconds, 0, page)
    deep = _tokens_within(model, seconds, max(context_length - page, 0), page)
    overlay = {
        "components": {
            "scheduler": {
                "args": {
                    "max_prefill_step_seconds": seconds,
                    "prefill_seconds": Ref("call", "model_runner", ("prefill_seconds",)),
                }
            }
        }
    }
    return overlay, (
        f"prefill steps of at most {seconds * 1e3:.1f} ms ({why}): {first} fresh tokens at the "
        f"start of a prompt, {deep} at {context_length:,} tokens deep (and at most the "
        "wiring's chunked_prefill_size)"
    )
