"""The plain policies: ``round_robin``, ``least_loaded`` and ``longest_prefix``."""

from __future__ import annotations

from typing import ClassVar

import attrs

from schedkit.router.base import Candidates, register_policy

__all__ = ["LeastLoaded", "LongestPrefix", "RoundRobin"]


@register_policy
@attrs.define
class RoundRobin:
    """The live ranks in turn. Signals: none."""

    name: ClassVar[str] = "round_robin"
    signals: ClassVar[tuple[str, ...]] = ()
    uses_prefix: ClassVar[bool] = False
    uses_pending: ClassVar[bool] = False
    _turn: int = attrs.field(default=0, init=False)

    def choose(self, c: Candidates) -> tuple[int, str]:
        """The next live rank."""
        rank = c.ranks[self._turn % len(c.ranks)]
        self._turn += 1
        return rank, "round_robin"


@register_policy
@attrs.define
class LeastLoaded:
    """The rank with the fewest requests in flight; among equals the one sent the fewest so
    far, then the lowest. Signals: requests in flight."""

    name: ClassVar[str] = "least_loaded"
    signals: ClassVar[tuple[str, ...]] = ("requests",)
    uses_prefix: ClassVar[bool] = False
    uses_pending: ClassVar[bool] = False

    def choose(self, c: Candidates) -> tuple[int, str]:
        """The least loaded rank."""
        workers = c.loads.workers
        return min(c.ranks, key=lambda r: (workers[r].requests, workers[r].routed)), "least_loaded"


@register_policy
@attrs.define
class LongestPrefix:
    """The most matched pages (KV events); ties to the fewest requests in flight, then the
    rank chosen least recently (the KV-router example's rule). Signals: the KV-event prefix,
    requests in flight."""

    name: ClassVar[str] = "longest_prefix"
    signals: ClassVar[tuple[str, ...]] = ("prefix", "requests")
    uses_prefix: ClassVar[bool] = True
    uses_pending: ClassVar[bool] = False
    _last_chosen: dict[int, int] = attrs.field(factory=dict, init=False)
    _routes: int = attrs.field(default=0, init=False)

    def choose(self, c: Candidates) -> tuple[int, str]:
        """The rank holding the longest prefix."""
        workers = c.loads.workers
        best = max(c.matched.get(r, 0) for r in c.ranks)
        tied = [r for r in c.ranks if c.matched.get(r, 0) == best]
        rank = min(tied, key=lambda r: (workers[r].requests, self._last_chosen.get(r, -1)))
        self._last_chosen[rank] = self._routes
        self._routes += 1
        return rank, "tie" if len(tied) > 1 else "prefix"
