"""A model runner that returns the tokens a test chose, for swapping in from a wiring overlay."""

from __future__ import annotations

import attrs

from schedkit import component
from schedkit.core.schedule_batch import ForwardMode, GenerationBatchResult, ScheduleBatch


@component("scripted_model_runner")
class ScriptedModelRunner:
    """Returns ``script[rid][i]`` as request ``rid``'s ``i``-th output token.

    A request without a script, or past the end of its script, gets ``fill_token``. Put
    ``eos_token_id`` in a script to end the request there. Every step takes ``step_seconds``
    on a virtual clock; ``batches`` records each batch's mode and request ids.
    """

    script: dict[str, list[int]] = attrs.field(factory=dict)
    fill_token: int = 0
    eos_token_id: int | None = None
    step_seconds: float = 0.01
    batches: list[tuple[str, list[str]]] = attrs.field(init=False, factory=list)
    _time: float = attrs.field(init=False, default=0.0)

    def now(self) -> float:
        """Seconds of virtual time: ``step_seconds`` per batch run so far."""
        return self._time

    def wait_until(self, t: float) -> None:
        """Jump the clock to ``t`` (the run driver calls this while waiting for arrivals)."""
        self._time = max(self._time, t)

    def forward(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """The scripted next token of each request (None for a prefill chunk that does not
        reach the end of its prompt)."""
        reqs = batch.reqs
        if batch.forward_mode == ForwardMode.DECODE:
            tokens = [self.token(req.rid, len(req.output_ids)) for req in reqs]
        elif batch.forward_mode == ForwardMode.EXTEND:
            tokens = [
                self.token(req.rid, len(req.output_ids)) if pre + ext >= req.seqlen else None
                for req, pre, ext in zip(reqs, batch.prefix_lens, batch.extend_lens, strict=True)
            ]
        else:
            return GenerationBatchResult(next_token_ids=[], elapsed=0.0)
        self.batches.append((batch.forward_mode.name, [req.rid for req in reqs]))
        self._time += self.step_seconds
        return GenerationBatchResult(next_token_ids=tokens, elapsed=self.step_seconds)

    def token(self, rid: str, position: int) -> int:
        """The token at output ``position`` of request ``rid``."""
        tokens = self.script.get(rid, ())
        return tokens[position] if position < len(tokens) else self.fill_token
