"""How much KV room admission keeps for running requests' future tokens, after SGLang's
``new_token_ratio``: the ratio itself (decaying, reset, set after a retraction) and the
remaining tokens it applies to."""

from __future__ import annotations

import attrs

from schedkit.core.schedule_batch import Req

__all__ = ["CLIP_MAX_NEW_TOKENS", "RETRACT_DECODE_STEPS", "NewTokenRatio", "remaining_new_tokens"]

# After a retraction, the remaining requests must have room for this many decode steps.
RETRACT_DECODE_STEPS = 20

# Admission counts at most this many future tokens per request (SGLang's value).
CLIP_MAX_NEW_TOKENS = 4096


def remaining_new_tokens(req: Req) -> int:
    """The output tokens ``req`` may still produce, clipped as SGLang clips them."""
    return min(req.sampling_params.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS)


@attrs.define(slots=True)
class NewTokenRatio:
    """The share of each running request's remaining tokens that admission reserves.

    It starts at ``init``, falls linearly to ``minimum`` over ``decay_steps`` decode steps that
    found room (at once when ``minimum`` is above ``init``, as SGLang's decay does), is set after
    a retraction from what the kept requests still need (SGLang's estimate), and goes back to
    ``init`` when the scheduler idles or its cache is flushed.
    """

    init: float = 0.7
    minimum: float = 0.098
    decay_steps: int = 600
    value: float = attrs.field(init=False)
    _step: float = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        for name, ratio in (
            ("init_new_token_ratio", self.init),
            ("min_new_token_ratio", self.minimum),
        ):
            if not 0.0 <= ratio <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {ratio}")
        self.value = self.init
        self._step = (self.init - self.minimum) / self.decay_steps

    @classmethod
    def conservative(
        cls, init: float, minimum: float, decay_steps: int, conservativeness: float
    ) -> NewTokenRatio:
        """SGLang's ``schedule_conservativeness``: ``init`` scaled by it (at most 1) and the
        minimum kept at the same fraction of the scaled ``init`` (at most 1)."""
        if not conservativeness >= 0.0:
            raise ValueError(f"schedule_conservativeness must be >= 0, got {conservativeness}")
        if conservativeness == 1.0:
            return cls(init, minimum, decay_steps)
        scaled = min(init * conservativeness, 1.0)
        floor = min(scaled * minimum / init, 1.0) if init else min(minimum * conservativeness, 1.0)
        return cls(scaled, floor, decay_steps)

    def decay(self) -> None:
        """One decode step went well: reserve a little less."""
        self.value = max(self.value - self._step, self.minimum)

    def decay_run(self, steps: int) -> None:
        """``steps`` decode steps went well: ``decay`` as many times."""
        value, step, minimum = self.value, self._step, self.minimum
        for _ in range(steps):
            if value == minimum and step >= 0:
                break  # it stays there
            value = max(value - step, minimum)
        self.value = value

    def reset(self) -> None:
        """Back to the initial ratio."""
        self.value = self.init

    def after_retract(self, decoded: int, running: int, max_new_tokens: int) -> None:
        """Set from the kept requests as SGLang estimates it: ``decoded`` of their
        ``max_new_tokens`` tokens are out and ``running`` requests need room for a few more
        steps each, over ``max_new_tokens + 1`` (0.0 when nothing is kept), at most 1."""
        needed = decoded + RETRACT_DECODE_STEPS * running
        self.value = min(1.0, needed / (max_new_tokens + 1))
