"""A simulated model runner: deterministic tokens and a cost model instead of a GPU.

Step time (seconds)::

    prefill = prefill_fixed + prefill_per_token * sum(new_tokens)
              + attention_coeff * sum(new_tokens * prefix_len + new_tokens * (new_tokens + 1) / 2)
              + overhead
    decode  = decode_fixed + decode_per_seq * batch_size + decode_per_kv_token * total_context
              + overhead
    overhead = step_overhead + request_overhead * batch_size

The attention term counts causal (query, key) pairs: each new token attends to the request's
cached prefix and to the new tokens up to itself. ``total_context`` is the sum of the decoding
requests' lengths. The defaults are the ``llama3-8b`` / ``h100`` preset's coefficients
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
default to 0 here, and the presets (``schedkit.runner.presets``) set them to BLIS's fitted 126 us
per step and 4.4 us per request. Presets for other models and GPUs scale the fitted
coefficients by shape and datasheet; ``schedkit calibrate`` fits them to your own measured
step times.

``zero_cost`` (or all coefficients 0) makes every step free, for measuring the scheduler itself.
``transfer_seconds`` (the host-tier cache's ``take_transfer_seconds``) adds the time of KV copied
back from host memory to the prefill step that uses it.
With ``clock="virtual"`` ``now()`` advances by each step's modelled time and nothing sleeps;
with ``clock="wall"`` each step sleeps its modelled time and ``now()`` is ``time.monotonic()``
relative to construction. ``wait_until(t)`` lets an idle driver move the clock to the next
arrival (a jump for the virtual clock, a sleep for the wall clock).

Tokens: a seeded table of ``TOKEN_TABLE_SIZE`` pseudo-random tokens is built at construction;
request ``rid`` reads it from an offset derived from ``(seed, rid)``, so the token at output
position ``p`` depends on ``(seed, rid, p)`` only and does not change when a request is retracted
and recomputed. A fraction ``eos_probability`` of the table's entries (chosen by the seed) is
``eos_token_id``; no other entry is, so with the default 0 every request runs to
``max_new_tokens``. Token ids are drawn from ``[0, vocab_size)``; the default 32,000 is a
Llama-2-sized vocabulary, not Llama-3's 128,256 (the cost defaults above take Llama-3-8B's
layer shape, which the vocabulary does not affect); ``--model`` presets set the model's own.
"""

from __future__ import annotations

import functools
import hashlib
import random
import time
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate, repeat
from operator import add, and_, attrgetter, is_, mul
from typing import Any, Literal

import attrs

from schedkit.core.component import ArgumentError, component
from schedkit.core.schedule_batch import (
    ForwardMode,
    GenerationBatchResult,
    Req,
    ScheduleBatch,
)

__all__ = ["TIME_TERMS", "TOKEN_TABLE_SIZE", "SimulatedModelRunner"]

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

TOKEN_TABLE_SIZE = 1 << 16
_TABLE_MASK = TOKEN_TABLE_SIZE - 1
_MAX_CACHED_RIDS = 1 << 16
_OUTPUT_IDS = attrgetter("output_ids")
_PROMPT = attrgetter("origin_input_ids")


def _offset(seed: int, rid: str) -> int:
    """Where request ``rid`` starts reading the token table."""
    digest = hashlib.blake2b(f"{seed}:{rid}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


@functools.lru_cache(maxsize=16)
def _token_table(
    seed: int, vocab_size: int, eos_token_id: int | None, eos_probability: float
) -> list[int]:
    """The token table of runners built with these arguments (shared: nothing writes it)."""
    rng = random.Random(seed)
    table = rng.choices(range(vocab_size), k=TOKEN_TABLE_SIZE)
    if eos_token_id is not None:
        table = [(t + 1) % vocab_size if t == eos_token_id else t for t in table]
        num_eos = round(eos_probability * TOKEN_TABLE_SIZE)
        for i in rng.sample(range(TOKEN_TABLE_SIZE), num_eos):
            table[i] = eos_token_id
    return table


@component("simulated_model_runner")
class SimulatedModelRunner:
    """Runs a batch by computing the modelled step time and deterministic next tokens."""

    seed: int = 0
    vocab_size: int = 32000
    eos_token_id: int | None = None
    eos_probability: float = 0.0
    clock: Literal["virtual", "wall"] = "virtual"
    zero_cost: bool = False
    prefill_fixed: float = 2.356e-3
    prefill_per_token: float = 2.129e-5
    attention_coeff: float = 8.142e-10
    decode_fixed: float = 6.137e-3
    decode_per_seq: float = 1.413e-5
    decode_per_kv_token: float = 4.651e-8
    step_overhead: float = 0.0
    request_overhead: float = 0.0
    # Seconds of KV transfers to add to the next prefill step (the host tier's load-backs).
    transfer_seconds: Callable[[], float] | None = None

    _time: float = attrs.field(init=False, default=0.0)
    _start: float = attrs.field(init=False, default=0.0)
    # rid -> _offset(seed, rid), a plain dict (its lookups are the fastest) filled on first use.
    _offsets: dict[str, int] = attrs.field(init=False, factory=dict, repr=False)
    _table: list[int] = attrs.field(init=False, factory=list, repr=False)
    # The last decode batch's output lists and table starts (see ``_starts``).
    _batch_outputs: list[list[int]] = attrs.field(init=False, factory=list, repr=False)
    _batch_starts: list[int] = attrs.field(init=False, factory=list, repr=False)

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too)."""
        if args.clock not in ("virtual", "wall"):
            raise ArgumentError("clock", f"clock must be 'virtual' or 'wall', got {args.clock!r}")
        vocab_size = args.vocab_size
        if not isinstance(vocab_size, int) or vocab_size < 2:
            raise ArgumentError(
                "vocab_size", f"vocab_size must be an integer >= 2, got {vocab_size!r}"
            )
        eos = args.eos_token_id
        if eos is not None and not 0 <= eos < vocab_size:
            raise ArgumentError(
                "eos_token_id", f"eos_token_id must be in [0, vocab_size={vocab_size}), got {eos}"
            )
        if not 0.0 <= args.eos_probability <= 1.0:
            raise ArgumentError(
                "eos_probability", f"eos_probability must be in [0, 1], got {args.eos_probability}"
            )
        if args.eos_probability > 0 and eos is None:
            raise ArgumentError("eos_probability", "eos_probability > 0 needs an eos_token_id")
        for name in TIME_TERMS:
            if getattr(args, name) < 0:
                raise ArgumentError(name, f"{name} must be >= 0 seconds, got {getattr(args, name)}")

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)
        self._table = _token_table(
            self.seed, self.vocab_size, self.eos_token_id, self.eos_probability
        )
        self._start = time.monotonic()

    def now(self) -> float:
        """Seconds since start: virtual (sum of modelled step times) or wall-clock."""
        if self.clock == "virtual":
            return self._time
        return time.monotonic() - self._start

    def wait_until(self, t: float) -> None:
        """Let the clock reach ``t`` (seconds on the ``now()`` scale) with nothing running:
        the virtual clock jumps there, the wall clock sleeps until then."""
        if self.clock == "virtual":
            self._time = max(self._time, t)
            return
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

    def forward(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """One forward pass: the next token of each request (None for a prefill chunk that
        does not reach the end of its request) and the step time."""
        reqs = batch.reqs
        table = self._table
        if batch.forward_mode == ForwardMode.DECODE:
            outputs = list(map(_OUTPUT_IDS, reqs))
            lengths = list(map(len, outputs))
            # table[start + length & mask] for each request, in C.
            starts = self._starts(reqs, outputs)
            positions = map(and_, map(add, starts, lengths), repeat(_TABLE_MASK))
            tokens = list(map(table.__getitem__, positions))
            cost = 0.0 if self.zero_cost else self.decode_cost(reqs, sum(lengths))
        elif batch.forward_mode == ForwardMode.EXTEND:
            tokens = [
                self.token(req.rid, len(req.output_ids)) if pre + ext >= req.seqlen else None
                for req, pre, ext in zip(reqs, batch.prefix_lens, batch.extend_lens, strict=True)
            ]
            cost = 0.0 if self.zero_cost else self.prefill_cost(batch)
            if self.transfer_seconds is not None and not self.zero_cost:
                cost += self.transfer_seconds()
        else:
            return GenerationBatchResult(next_token_ids=[], elapsed=0.0)
        if self.clock == "virtual":
            self._time += cost
            return GenerationBatchResult(next_token_ids=tokens, elapsed=cost)
        start = time.monotonic()
        if cost > 0:
            time.sleep(cost)
        return GenerationBatchResult(next_token_ids=tokens, elapsed=time.monotonic() - start)

    def forward_decode_run(
        self,
        reqs: list[Req],
        max_steps: int,
        until: float,
        origin: float = 0.0,
        stop_before: int | None = None,
    ) -> tuple[list[float], list[list[int]]]:
        """Up to ``max_steps`` decode steps of the unchanging batch ``reqs`` on the virtual
        clock, each taken while the clock is still before ``until`` seconds after ``origin``
        and none giving a request the token ``stop_before``: each step's end time (the clock
        is left at the last) and each request's tokens, exactly what as many ``forward``
        calls give. Nothing runs (empty lists) on the wall clock."""
        if self.clock != "virtual" or not reqs or max_steps < 1:
            return [], []
        max_steps = min(max_steps, TOKEN_TABLE_SIZE)
        outputs = list(map(_OUTPUT_IDS, reqs))
        lengths = list(map(len, outputs))
        n = len(reqs)
        if self.zero_cost:
            base, per_kv = 0.0, 0.0
        else:
            base = (
                self.decode_fixed
                + self.step_overhead
                + (self.decode_per_seq + self.request_overhead) * n
            )
            per_kv = self.decode_per_kv_token
        context = sum(map(len, map(_PROMPT, reqs))) + sum(lengths)
        times = _step_ends(self._time, base, per_kv, context, n, max_steps, until, origin)
        steps = len(times)
        if not steps:
            return [], []
        table, tokens = self._table, []
        for start in map(add, self._starts(reqs, outputs), lengths):
            start &= _TABLE_MASK
            run = table[start : start + steps]
            if len(run) < steps:
                run += table[: steps - len(run)]
            tokens.append(run)
        if stop_before is not None:
            cut = min(
                (run.index(stop_before) for run in tokens if stop_before in run), default=steps
            )
            if cut < steps:
                steps = cut
                del times[steps:]
                tokens = [run[:steps] for run in tokens]
        if steps:
            self._time = times[-1]
        return times, tokens

    def prefill_cost(self, batch: ScheduleBatch) -> float:
        """Modelled time of an extend batch."""
        new_tokens = sum(batch.extend_lens)
        pairs = sum(
            ext * pre + ext * (ext + 1) // 2
            for pre, ext in zip(batch.prefix_lens, batch.extend_lens, strict=True)
        )
        return (
            self.prefill_fixed
            + self.prefill_per_token * new_tokens
            + self.attention_coeff * pairs
            + self.step_overhead
            + self.request_overhead * len(batch.reqs)
        )

    def prefill_seconds(self, tokens: int, prefix: int) -> float:
        """Modelled time of a prefill step of one request's ``tokens`` fresh tokens after
        ``prefix`` tokens with KV (0 with ``zero_cost``)."""
        if self.zero_cost:
            return 0.0
        return (
            self.prefill_fixed
            + self.prefill_per_token * tokens
            + self.attention_coeff * (tokens * prefix + tokens * (tokens + 1) // 2)
            + self.step_overhead
            + self.request_overhead
        )

    def decode_cost(self, reqs: list[Req], output_tokens: int | None = None) -> float:
        """Modelled time of a decode step over ``reqs`` (``output_tokens``: their output
        lengths' sum, when the caller has it)."""
        cost = (
            self.decode_fixed
            + self.step_overhead
            + (self.decode_per_seq + self.request_overhead) * len(reqs)
        )
        if self.decode_per_kv_token:
            if output_tokens is None:
                output_tokens = sum(map(len, map(_OUTPUT_IDS, reqs)))
            context = sum(map(len, map(_PROMPT, reqs))) + output_tokens
            cost += self.decode_per_kv_token * context
        return cost

    def _starts(self, reqs: list[Req], outputs: list[list[int]]) -> list[int]:
        """Where each request of a decode batch reads the token table: kept while the batch
        has the same requests (recognised by their output lists, which are kept alive here
        so that no other list can take their identity)."""
        kept = self._batch_outputs
        if len(kept) != len(outputs) or not all(map(is_, outputs, kept)):
            offsets = self._offsets
            try:
                starts = [offsets[req.rid] for req in reqs]
            except KeyError:
                starts = [self.token_offset(req.rid) for req in reqs]
            self._batch_outputs, self._batch_starts = outputs, starts
        return self._batch_starts

    def token(self, rid: str, position: int) -> int:
        """The token at output ``position`` of request ``rid`` (deterministic for the seed)."""
        return self._table[self.token_offset(rid) + position & _TABLE_MASK]

    def token_offset(self, rid: str) -> int:
        """Where request ``rid`` starts reading the token table."""
        offset = self._offsets.get(rid)
        if offset is None:
            if len(self._offsets) >= _MAX_CACHED_RIDS:
                self._offsets.clear()
            offset = self._offsets[rid] = _offset(self.seed, rid)
        return offset


def _step_ends(
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
