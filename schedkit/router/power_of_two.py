"""``power_of_two``: two workers drawn at random, the one with fewer tokens in flight
(prefill still to compute plus decode context) wins; the SGLang model gateway's
``power_of_two`` policy (``sgl-model-gateway/src/policies/power_of_two.rs``) compares the two
by load in the same way. Signals: prefill and decode tokens."""

from __future__ import annotations

import random
from typing import ClassVar

import attrs

from schedkit.router.base import Candidates, register_policy

__all__ = ["PowerOfTwo"]


@register_policy
@attrs.define(kw_only=True)
class PowerOfTwo:
    """Two random workers, the less loaded by tokens (the first drawn among equals)."""

    name: ClassVar[str] = "power_of_two"
    signals: ClassVar[tuple[str, ...]] = ("prefill_tokens", "decode_tokens")
    uses_prefix: ClassVar[bool] = False
    uses_pending: ClassVar[bool] = False

    seed: int | None = 0
    _rng: random.Random = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def choose(self, c: Candidates) -> tuple[int, str]:
        """The less loaded of two distinct random workers (the only one when one is live)."""
        if len(c.ranks) == 1:
            return c.ranks[0], "only"
        first, second = self._rng.sample(c.ranks, 2)
        workers = c.loads.workers
        pick = second if workers[second].tokens < workers[first].tokens else first
        return pick, "power_of_two"
