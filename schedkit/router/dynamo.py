"""``dynamo``: NVIDIA Dynamo's KV router cost (``lib/llm/src/kv_router/scheduler.rs``,
``DefaultWorkerSelector``; ``sequence.rs``, ``ActiveSequences``; ``KvRouterConfig::default``).

For every worker, with the request's prompt of ``isl`` tokens in pages of ``page_size``:

- ``potential_prefill_blocks = (prefill tokens queued on the worker + isl - overlap *
  page_size) / page_size``: the prompt tokens the worker still has to compute if it gets the
  request; ``overlap`` is the pages of the prompt the worker holds by its KV events;
- ``potential_blocks = active blocks + new blocks``: the distinct pages of the prompts of
  the requests active on it (routed and not finished; ``router_track_active_blocks``, prompts
  only as ``router_track_output_blocks`` is off by default) plus the request's pages not among
  them;
- ``logit = overlap_score_weight * potential_prefill_blocks + potential_blocks`` (lower is
  better), divided by the largest logit; then softmax sampling at ``temperature`` over the
  negated logits scaled by their range, or, at temperature 0, the lowest logit; workers tied
  on it go to the smallest tree: the pages the worker holds in the KV-event index if it
  matched part of the prompt, else 0 (Dynamo's ``OverlapScores.tree_sizes`` is filled only
  for the workers ``find_matches`` met); the workers still tied, at random (Dynamo takes the
  first of a ``HashMap``'s iteration, an order that is random per map).

Defaults are Dynamo's: ``overlap_score_weight`` 1.0, ``router_temperature`` 0.0
(``SchedulerConfig::default``, ``lib/kv-router/src/scheduler.rs`` of ai-dynamo/dynamo).
Signals: prefill tokens, its own record of the active requests' pages, the KV-event prefix
and each matched worker's indexed pages.
"""

from __future__ import annotations

import math
import random
from typing import ClassVar

import attrs

from schedkit.router.base import Candidates, hold_pages, register_policy, release_pages

__all__ = ["DynamoKvCost", "softmax_sample"]


def softmax_sample(logits: dict[int, float], temperature: float, rng: random.Random) -> int:
    """Dynamo's ``softmax_sample``: the lowest logit at temperature 0 (ties at random); else
    a draw with probabilities ``softmax(-logit / (max - min) / temperature)``."""
    low = min(logits.values())
    if temperature == 0:
        return rng.choice([k for k, v in logits.items() if v == low])
    high = max(logits.values())
    keys = list(logits)
    if high == low:
        return rng.choice(keys)
    scaled = [-logits[k] / (high - low) / temperature for k in keys]
    top = max(scaled)
    weights = [math.exp(s - top) for s in scaled]
    return rng.choices(keys, weights=weights)[0]


@register_policy
@attrs.define(kw_only=True)
class DynamoKvCost:
    """Dynamo's KV router cost and softmax selection (see the module docstring)."""

    name: ClassVar[str] = "dynamo"
    signals: ClassVar[tuple[str, ...]] = ("prefill_tokens", "prefix", "own_tree")
    uses_prefix: ClassVar[bool] = True
    uses_pending: ClassVar[bool] = False

    overlap_score_weight: float = attrs.field(default=1.0, validator=attrs.validators.ge(0))
    temperature: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
    seed: int | None = 0
    _rng: random.Random = attrs.field(init=False)
    _active: dict[int, dict[int, int]] = attrs.field(factory=dict, init=False)
    _requests: dict[str, tuple[int, list[int]]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def choose(self, c: Candidates) -> tuple[int, str]:
        """The rank by Dynamo's cost (see the module docstring)."""
        page = c.page_size
        hashes = c.hashes
        isl = c.prompt_tokens
        workers = c.loads.workers
        logits: dict[int, float] = {}
        for rank in c.ranks:
            active = self._active.get(rank, {})
            new_blocks = len(hashes) - sum(map(active.__contains__, hashes))
            overlap = c.matched.get(rank, 0)
            new_tokens = max(0, isl - overlap * page)
            prefill_blocks = (workers[rank].prefill_tokens + new_tokens) / page
            logits[rank] = self.overlap_score_weight * prefill_blocks + len(active) + new_blocks
        top = max(logits.values())
        if top > 0:
            logits = {r: v / top for r, v in logits.items()}
        if self.temperature > 0:
            return softmax_sample(logits, self.temperature, self._rng), "cost"
        low = min(logits.values())
        tied = [r for r, v in logits.items() if v == low]
        if len(tied) > 1:
            matched = c.matched
            sizes = {r: c.cached_pages(r) if matched.get(r, 0) else 0 for r in tied}
            smallest = min(sizes.values())
            tied = [r for r in tied if sizes[r] == smallest]
        return (tied[0] if len(tied) == 1 else self._rng.choice(tied)), "cost"

    def on_routed(self, c: Candidates, rank: int, rid: str) -> None:
        """The request's pages join ``rank``'s active blocks until it finishes."""
        self.on_finished(rid)
        hashes = c.hashes
        hold_pages(self._active.setdefault(rank, {}), hashes)
        self._requests[rid] = (rank, hashes)

    def on_finished(self, rid: str) -> None:
        """The request's pages leave its worker's active blocks."""
        entry = self._requests.pop(rid, None)
        if entry is None:
            return
        rank, hashes = entry
        active = self._active.get(rank)
        if active is None:
            return
        release_pages(active, hashes)

    def on_removed(self, rank: int) -> None:
        """A worker left: forget its active requests."""
        self._active.pop(rank, None)
        for rid in [rid for rid, (r, _) in self._requests.items() if r == rank]:
            del self._requests[rid]
