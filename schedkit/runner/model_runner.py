"""A simulated model runner: deterministic tokens and a cost model instead of a GPU.

Each step's time comes from the cost model (``step_costs``: fixed, per-token, attention and
per-request terms whose defaults are Llama-3-8B on one H100). ``zero_cost`` (or all
coefficients 0) makes every step free, for measuring the scheduler itself.
``transfer_seconds`` (the host-tier cache's ``take_transfer_seconds``) adds the time of KV copied
back from host memory to the prefill step that uses it.
With ``clock="virtual"`` ``now()`` advances by each step's modelled time and nothing sleeps;
with ``clock="wall"`` each step sleeps its modelled time and ``now()`` is ``time.monotonic()``
relative to construction. ``wait_until(t)`` lets an idle driver move the clock to the next
arrival (a jump for the virtual clock, a sleep for the wall clock).

Tokens come from a seeded table (``token_table``): the token at output position ``p`` of
request ``rid`` depends on ``(seed, rid, p)`` only, so a retracted request recomputes the same
tokens. A fraction ``eos_probability`` of the table is ``eos_token_id``; with the default 0
every request runs to ``max_new_tokens``. Token ids are drawn from ``[0, vocab_size)``; the
default 32,000 is a Llama-2-sized vocabulary, not Llama-3's 128,256 (the cost defaults take
Llama-3-8B's layer shape, which the vocabulary does not affect); ``--model`` presets set the
model's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import repeat
from operator import add, and_, attrgetter, is_
from typing import Any, Literal

import attrs

from schedkit.core.component import ArgumentError, component
from schedkit.core.schedule_batch import (
    ForwardMode,
    GenerationBatchResult,
    Req,
    ScheduleBatch,
)
from schedkit.runner.step_costs import TIME_TERMS, StepCosts, decode_context, decode_step_ends
from schedkit.runner.token_table import TABLE_MASK, TOKEN_TABLE_SIZE, request_offset, token_table

__all__ = ["TIME_TERMS", "TOKEN_TABLE_SIZE", "SimulatedModelRunner"]

# How many requests' table offsets are kept before the cache starts afresh.
_MAX_CACHED_RIDS = 1 << 16
_OUTPUT_IDS = attrgetter("output_ids")


@component("simulated_model_runner")
class SimulatedModelRunner(StepCosts):
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
    # rid -> request_offset(seed, rid), a plain dict (its lookups are the fastest), filled on
    # first use.
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
        self._table = token_table(
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
            positions = map(and_, map(add, starts, lengths), repeat(TABLE_MASK))
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
            base, per_kv = self.decode_base(n), self.decode_per_kv_token
        context = decode_context(reqs, sum(lengths))
        times = decode_step_ends(self._time, base, per_kv, context, n, max_steps, until, origin)
        steps = len(times)
        if not steps:
            return [], []
        table, tokens = self._table, []
        for start in map(add, self._starts(reqs, outputs), lengths):
            start &= TABLE_MASK
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
        return self._table[self.token_offset(rid) + position & TABLE_MASK]

    def token_offset(self, rid: str) -> int:
        """Where request ``rid`` starts reading the token table."""
        offset = self._offsets.get(rid)
        if offset is None:
            if len(self._offsets) >= _MAX_CACHED_RIDS:
                self._offsets.clear()
            offset = self._offsets[rid] = request_offset(self.seed, rid)
        return offset
