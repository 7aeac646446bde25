"""``llm-d``: llm-d's inference scheduler (the endpoint picker) with the scorers and weights
of its precise prefix-cache profile (llm-d guide ``precise-prefix-cache-aware``:
``precise-prefix-cache-scorer`` 3.0, ``kv-cache-utilization-scorer`` 2.0, ``queue-scorer``
2.0, ``max-score-picker``).

Each scorer gives every worker a score in [0, 1]; the picker takes the largest weighted sum,
ties at random:

- precise prefix cache (``llm-d-inference-scheduler``, ``preciseprefixcache``): the leading
  pages of the prompt each worker holds by its KV events, min-max normalised over the workers
  that hold at least one (``indexedScoresToNormalizedScoredPods``: all 1.0 when they hold as
  many; 0 for a worker holding none);
- queue (gateway-api-inference-extension ``queue-scorer``): ``(max - q) / (max - min)`` of
  the workers' waiting requests ``q`` (1.0 when all equal); here ``q`` is the requests routed
  to the worker whose first token has not come back;
- KV-cache utilisation (``kv-cache-utilization-scorer``): ``1 - usage``, the usage the worker
  last reported.

Signals: the KV-event prefix, queued requests, reported KV usage.
"""

from __future__ import annotations

import random
from typing import ClassVar

import attrs

from schedkit.router.base import Candidates, register_policy

__all__ = ["LlmdScorers"]


@register_policy
@attrs.define(kw_only=True)
class LlmdScorers:
    """llm-d's weighted scorers and max-score picker (see the module docstring)."""

    name: ClassVar[str] = "llm-d"
    signals: ClassVar[tuple[str, ...]] = ("prefix", "queued", "kv_usage")
    uses_prefix: ClassVar[bool] = True
    uses_pending: ClassVar[bool] = False

    prefix_weight: float = attrs.field(default=3.0, validator=attrs.validators.ge(0))
    kv_usage_weight: float = attrs.field(default=2.0, validator=attrs.validators.ge(0))
    queue_weight: float = attrs.field(default=2.0, validator=attrs.validators.ge(0))
    seed: int | None = 0
    _rng: random.Random = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def choose(self, c: Candidates) -> tuple[int, str]:
        """The worker with the largest weighted score."""
        workers = c.loads.workers
        held = {r: c.matched.get(r, 0) for r in c.ranks if c.matched.get(r, 0) > 0}
        low_p, high_p = min(held.values(), default=0), max(held.values(), default=0)
        queues = {r: workers[r].queued for r in c.ranks}
        low_q, high_q = min(queues.values()), max(queues.values())
        scores = {}
        for r in c.ranks:
            if r not in held:
                prefix = 0.0
            elif high_p == low_p:
                prefix = 1.0
            else:
                prefix = (held[r] - low_p) / (high_p - low_p)
            queue = 1.0 if high_q == low_q else (high_q - queues[r]) / (high_q - low_q)
            kv = 1.0 - min(1.0, max(0.0, workers[r].kv_usage))
            scores[r] = (
                self.prefix_weight * prefix + self.queue_weight * queue + self.kv_usage_weight * kv
            )
        best = max(scores.values())
        return self._rng.choice([r for r in c.ranks if scores[r] == best]), "score"
