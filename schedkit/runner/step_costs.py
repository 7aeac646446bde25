"""The simulated model runner's cost model: how long a prefill or decode step takes.

Step time (seconds)::

    prefill = prefill_fixed + prefill_per_token * sum(new_tokens)
              + attention_coeff * sum(new_tokens * prefix_len + new_tokens * (new_tokens + 1) / 2)
              + overhead
    decode  = decode_fixed + decode_per_seq * batch_size + decode_per_kv_token * total_context
              + overhead
    overhead = step_overhead + request_overhead * batch_size

The attention term counts causal (query, key) pairs: each new token attends to the request's
cached prefix and to the new tokens up to itself. ``total_context`` is the sum of the decoding
requests' lengths. The runner's defaults are the ``llama3-8b`` / ``h100`` preset's coefficients
(``schedkit.runner.presets``): Llama-3-8B in bf16 on one H100 SXM, fitted to step times built
from measured kernel times (Vidur's H100 operator profile, FlashAttention-3's published rates);
``benchmarks/presets_vs_measured.py`` prints the comparison, within 15% from prefills of 1k to
32k tokens and decode batches of 1 to 256:

- ``prefill_fixed`` 2.36 ms per prefill step, ``prefill_per_token`` 21.3 us (the layers'
  matmuls at 66% of the BF16 peak), ``attention_coeff`` 8.14e-10 s per causal pair (65% of it);
- ``decode_fixed`` 6.14 ms (all weights read once at 2.82 TB/s, plus the LM head),
  ``decode_per_seq`` 14.1 us, ``decode_per_kv_token`` 46.5 ns (one token's 128 KiB of KV read
  once per step).

``step_overhead`` and ``request_overhead`` are the scheduler's own CPU time around each forward
pass (batch building, sampling, bookkeeping), per step and per request in the batch; they
default to 0 in the runner, and the presets (``schedkit.runner.presets``) set them to BLIS's
fitted 126 us per step and 4.4 us per request. Presets for other models and GPUs scale the
fitted coefficients by shape and datasheet; ``schedkit calibrate`` fits them to your own
measured step times.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate, repeat
from operator import add, attrgetter, mul

from schedkit.core.schedule_batch import Req, ScheduleBatch

__all__ = ["TIME_TERMS", "StepCosts", "decode_step_ends"]

# The cost model's arguments that are seconds (or seconds per unit).
TIME_TERMS = (
    "prefill_fixed",
    "prefill_per_token",
    "attention_coeff",
    "decode_fixed",
    "decode_per_seq",
    "decode_per_kv_token",
    "step_overhead",
    "request_overhead",
)

_OUTPUT_IDS = attrgetter("output_ids")
_PROMPT = attrgetter("origin_input_ids")


class StepCosts:
    """The modelled times of ``SimulatedModelRunner``'s steps, from its ``TIME_TERMS``
    coefficients (seconds) and ``zero_cost``. Mixed into it; adds no fields."""

    __slots__ = ()

    def prefill_cost(self, batch: ScheduleBatch) -> float:
        """Modelled time of an extend batch."""
        pairs = sum(
            ext * pre + ext * (ext + 1) // 2
            for pre, ext in zip(batch.prefix_lens, batch.extend_lens, strict=True)
        )
        return self._prefill(sum(batch.extend_lens), pairs, len(batch.reqs))

    def prefill_seconds(self, tokens: int, prefix: int) -> float:
        """Modelled time of a prefill step of one request's ``tokens`` fresh tokens after
        ``prefix`` tokens with KV (0 with ``zero_cost``)."""
        if self.zero_cost:
            return 0.0
        return self._prefill(tokens, tokens * prefix + tokens * (tokens + 1) // 2, 1)

    def _prefill(self, new_tokens: int, pairs: int, reqs: int) -> float:
        """A prefill step of ``reqs`` requests: ``new_tokens`` fresh tokens, ``pairs`` causal
        (query, key) pairs."""
        return (
            self.prefill_fixed
            + self.prefill_per_token * new_tokens
            + self.attention_coeff * pairs
            + self.step_overhead
            + self.request_overhead * reqs
        )

    def decode_cost(self, reqs: list[Req], output_tokens: int | None = None) -> float:
        """Modelled time of a decode step over ``reqs`` (``output_tokens``: their output
        lengths' sum, when the caller has it)."""
        cost = self.decode_base(len(reqs))
        if self.decode_per_kv_token:
            if output_tokens is None:
                output_tokens = sum(map(len, map(_OUTPUT_IDS, reqs)))
            cost += self.decode_per_kv_token * decode_context(reqs, output_tokens)
        return cost

    def decode_base(self, batch_size: int) -> float:
        """The part of a decode step's time that does not grow with the context."""
        return (
            self.decode_fixed
            + self.step_overhead
            + (self.decode_per_seq + self.request_overhead) * batch_size
        )


def decode_context(reqs: list[Req], output_tokens: int) -> int:
    """Tokens of KV a decode step over ``reqs`` reads: their prompts and ``output_tokens``."""
    return sum(map(len, map(_PROMPT, reqs))) + output_tokens


def decode_step_ends(
    clock: float,
    base: float,
    per_kv: float,
    context: int,
    n: int,
    max_steps: int,
    until: float,
    origin: float,
) -> list[float]:
    """The end times of up to ``max_steps`` decode steps of ``n`` requests from ``clock``,
    each taken while ``clock - origin < until`` still holds at its start: step
    ``i`` costs ``base + per_kv * (context + n * i)`` (``base`` alone without ``per_kv``).
    The same float operations, in the same order, as adding one step at a time, done in
    chunks sized from the first step's cost."""
    times: list[float] = []
    while len(times) < max_steps and clock - origin < until:
        first = base + per_kv * context if per_kv else base
        chunk = max_steps - len(times)
        estimate = (until - (clock - origin)) / first if first > 0 else chunk
        if estimate < chunk:
            chunk = min(chunk, max(16, int(estimate) + 2))
        if per_kv:
            costs = map(
                add, repeat(base), map(mul, repeat(per_kv), range(context, context + n * chunk, n))
            )
        else:
            costs = repeat(base, chunk)
        ends = list(accumulate(costs, initial=clock))
        # Step i (from 1) runs if the clock before it, ends[i - 1], is before ``until``.
        runs = min(bisect_left(ends, until, key=lambda end: end - origin), chunk)
        times += ends[1 : runs + 1]
        if runs < chunk:
            break
        clock, context = ends[-1], context + n * chunk
    return times
