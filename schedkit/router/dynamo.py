"""``dynamo``: NVIDIA Dynamo 1.6.1's KV router cost (``lib/kv-router/src/scheduling/selector/
default.rs``, ``DefaultWorkerScorer::worker_logit`` and ``minimum_cost_index``;
``lib/kv-router/src/sequences``, the active sequences; defaults of ``KvRouterConfig`` as its
``dynamo.frontend`` sets them).

For every worker, with the request's prompt of ``isl`` tokens in pages of ``page_size``:

- ``raw_prefill_blocks = (prefill tokens queued on the worker + isl) / page_size``, the
  queued tokens being each routed prompt past the prefix it matched at routing, until its first
  token (``router_track_prefill_tokens``);
- ``prefill_cost = prefill_load_scale * max(0, raw_prefill_blocks - overlap_score_credit *
  overlap)``, ``overlap`` the pages of the prompt the worker holds by its KV events;
- ``decode_blocks = active blocks + new blocks``: the distinct pages of the prompts of the
  requests active on it (routed and not finished; ``router_track_active_blocks``, prompts only
  as ``router_track_output_blocks`` is off by default) plus the request's pages not among them;
- ``logit = prefill_cost + decode_blocks + decode_active_request_weight * requests active``
  (lower is better); at temperature 0 the lowest logit, equal lowest logits uniformly at random
  (reservoir sampling over the candidates); else softmax sampling over ``-(logit - min) /
  (max - min) / temperature``.

Defaults are Dynamo 1.6.1's: ``overlap_score_weight`` (its ``prefill_load_scale``, which the
deprecated ``--router-kv-overlap-score-weight`` sets) 1.0, ``overlap_score_credit`` 1.0,
``decode_active_request_weight`` 0.0, ``router_temperature`` 0.0. Signals: prefill tokens,
the KV-event prefix and its own record of the active requests' pages.
"""

from __future__ import annotations

import math
import random
from typing import ClassVar

import attrs

from schedkit.router.base import Candidates, hold_pages, register_policy, release_pages

__all__ = ["DynamoKvCost", "softmax_sample"]


def softmax_sample(logits: dict[int, float], temperature: float, rng: random.Random) -> int:
    """Dynamo's selection: the lowest logit at temperature 0 (a draw only among ties); else
    a draw with probabilities ``softmax(-logit / (max - min) / temperature)``."""
    low = min(logits.values())
    if temperature == 0:
        tied = [k for k, v in logits.items() if v == low]
        return tied[0] if len(tied) == 1 else rng.choice(tied)
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
    overlap_score_credit: float = attrs.field(default=1.0, validator=attrs.validators.ge(0))
    decode_active_request_weight: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
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
        credit = self.overlap_score_credit
        per_request = self.decode_active_request_weight
        logits: dict[int, float] = {}
        for rank in c.ranks:
            active = self._active.get(rank, {})
            new_blocks = len(hashes) - sum(map(active.__contains__, hashes))
            load = workers[rank]
            raw_prefill_blocks = (load.prefill_tokens + isl) / page
            prefill = max(0.0, raw_prefill_blocks - credit * c.matched.get(rank, 0))
            decode = len(active) + new_blocks + per_request * load.requests
            logits[rank] = self.overlap_score_weight * prefill + decode
        return softmax_sample(logits, self.temperature, self._rng), "cost"

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
