"""SGLang's new-token ratio: how much of the running requests' remaining output admission
keeps KV room for."""

from __future__ import annotations

import attrs

__all__ = ["RETRACT_DECODE_STEPS", "NewTokenRatio"]

# After a retraction, the remaining requests must have room for this many decode steps.
RETRACT_DECODE_STEPS = 20


@attrs.define(slots=True)
class NewTokenRatio:
    """The share of each running request's remaining tokens that admission reserves.

    It starts at ``init``, falls linearly to ``minimum`` over ``decay_steps`` decode steps that
    found room, is set after a retraction from what the kept requests still need, and goes
    back to ``init`` when the scheduler idles or its cache is flushed.
    """

    init: float = 0.7
    minimum: float = 0.098
    decay_steps: int = 600
    value: float = attrs.field(init=False)
    _step: float = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if not 0.0 <= self.minimum <= self.init <= 1.0:
            raise ValueError(
                "need 0 <= min_new_token_ratio <= init_new_token_ratio <= 1, got "
                f"{self.minimum} and {self.init}"
            )
        self.value = self.init
        self._step = (self.init - self.minimum) / self.decay_steps

    def decay(self) -> None:
        """One decode step went well: reserve a little less."""
        self.value = max(self.value - self._step, self.minimum)

    def reset(self) -> None:
        """Back to the initial ratio."""
        self.value = self.init

    def after_retract(self, decoded: int, running: int, max_new_tokens: int) -> None:
        """Set from the kept requests: ``decoded`` of their ``max_new_tokens`` tokens are out,
        and ``running`` requests need room for a few more steps each."""
        needed = decoded + RETRACT_DECODE_STEPS * running
        self.value = min(1.0, needed / max_new_tokens) if max_new_tokens else self.init
