"""``sglang``: the SGLang model gateway's cache-aware policy with its own approximate tree
(``sgl-model-gateway/src/policies/cache_aware.rs`` and ``tree.rs``).

The rule is ``schedkit.router.cache_aware``; the prefix match comes from an ``ApproxTree`` of
the prompts this policy sent to each worker, not from the workers' KV events: the prompt is
inserted into the chosen worker's tree when it is routed (on every path, imbalanced included),
and every ``eviction_interval`` seconds of the routing clock each worker's tree is cut to
``max_tree_size`` tokens, least recently used leaves first. Defaults are those of
``sglang-router`` 0.3.2, the package index's release (``sglang_router/router_args.py``): 0.3 /
64 / 1.5, eviction every 60 s, 67,108,864 per tree (the gateway counts characters; here
tokens); equally loaded workers go to the first (``tie_break="first"``). Signals: requests in
flight (``load="tokens"``: tokens in flight) and its own tree.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from schedkit.router.approx_tree import ApproxTree
from schedkit.router.base import Candidates, register_policy
from schedkit.router.cache_aware import CacheAwareRule

__all__ = ["SglangCacheAware"]


@register_policy
@attrs.define(kw_only=True)
class SglangCacheAware(CacheAwareRule):
    """The gateway's ``cache_aware`` policy (see the module docstring)."""

    name: ClassVar[str] = "sglang"
    signals: ClassVar[tuple[str, ...]] = ("requests", "own_tree")
    uses_prefix: ClassVar[bool] = False
    uses_pending: ClassVar[bool] = False

    eviction_interval: float = attrs.field(default=60.0, validator=attrs.validators.ge(0))
    max_tree_size: int = attrs.field(default=67_108_864, validator=attrs.validators.ge(0))
    _tree: ApproxTree | None = attrs.field(default=None, init=False)
    _next_eviction: float | None = attrs.field(default=None, init=False)

    def choose(self, c: Candidates) -> tuple[int, str]:
        """Route by the rule over this policy's own tree, then record the prompt there."""
        tree = self._tree
        if tree is None:
            tree = self._tree = ApproxTree(c.page_size)
        self._maybe_evict(c.now)
        hashes = c.hashes
        depth, holder = tree.match(hashes, frozenset(c.ranks))
        sizes = {r: tree.sizes.get(r, 0) // c.page_size for r in c.ranks}
        rank, reason = self.decide(c, depth, holder, sizes)
        tree.insert(hashes, rank)
        return rank, reason

    def _maybe_evict(self, now: float) -> None:
        if self.eviction_interval <= 0:
            return
        if self._next_eviction is None:
            self._next_eviction = now + self.eviction_interval
        elif now >= self._next_eviction:
            self._tree.evict(self.max_tree_size)
            self._next_eviction = now + self.eviction_interval

    def on_removed(self, rank: int) -> None:
        """A worker left: its tenancy leaves the tree."""
        if self._tree is not None:
            self._tree.remove_tenant(rank)
