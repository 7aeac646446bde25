"""``Router``: routes requests over the live ranks with a policy, keeping the load signals
(``LoadBoard``) and the prefix knowledge (a ``KvIndex`` fed with the ranks' KV events, and the
prompts routed but not yet prefilled) that policies read.

Whoever drives a router (``schedkit.fleet.offline``, ``schedkit.fleet.live``, the KV-router
example) tells it what happens to each request it routed: ``prefilled(rid)`` when the first
token comes back, ``finished(rid)`` when it ends (finished, failed or aborted), and
``report(rank, kv_usage=, waiting=)`` with a worker's own figures; ``remove(rank)`` takes a
dead worker out.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence

from schedkit.kv_events import KvIndex
from schedkit.router.base import Candidates, Route, RoutingPolicy
from schedkit.router.load import LoadBoard
from schedkit.router.pending import PendingPrompts

__all__ = ["Router"]


def _uncounted_pages(rank: int) -> int:
    raise RuntimeError(
        f"cached pages of rank {rank} are not counted: the policy's reads_cached_pages was "
        "False when the router was made"
    )


class Router:
    """Routes token sequences to the live ranks with ``policy`` (see the module docstring).
    ``clock`` gives the routing time in seconds (the wall clock by default; an offline fleet
    passes its virtual one). At most ``max_inflight`` requests are kept in flight: a driver
    that never reports ends (the KV-router example reading stdin) has its oldest taken as
    ended, counted in ``forgotten``."""

    def __init__(
        self,
        ranks: Sequence[int],
        page_size: int,
        policy: RoutingPolicy,
        index: KvIndex | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_inflight: int = 1_000_000,
    ) -> None:
        if not ranks:
            raise ValueError("a router needs at least one rank")
        self.ranks = sorted(ranks)
        self.page_size = page_size
        self.policy = policy
        self.index = KvIndex() if index is None else index
        self.loads = LoadBoard(self.ranks)
        # A policy that never compares cached page counts spares each routed prompt a check
        # of its pages against the index (``reads_cached_pages``, read once, here).
        self.pending = PendingPrompts(count_new=getattr(policy, "reads_cached_pages", True))
        self.clock = clock
        self.max_inflight = max_inflight
        self.forgotten = 0
        self._rids = itertools.count()
        self._on_routed = getattr(policy, "on_routed", None)
        self._on_finished = getattr(policy, "on_finished", None)
        self._on_removed = getattr(policy, "on_removed", None)

    def remove(self, rank: int) -> None:
        """Route nothing more to ``rank`` and forget what it cached and was sent."""
        if rank in self.ranks:
            self.ranks.remove(rank)
        self.index.clear_rank(rank)
        self.pending.clear_rank(rank)
        self.loads.remove(rank)
        if self._on_removed is not None:
            self._on_removed(rank)

    def _cached_pages(self, rank: int) -> int:
        return self.index.num_blocks(rank) + self.pending.num_pages(rank)

    def route(
        self,
        token_ids: Sequence[int],
        among: Sequence[int] | None = None,
        *,
        rid: str | None = None,
        session: str | None = None,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> Route:
        """Choose the live rank for a request and count it against that rank; LookupError
        when no rank is left. ``among`` limits the choice (e.g. to the ranks with room under
        admission control). ``rid`` names it for ``prefilled``/``finished`` (one is made up
        when None); ``session`` is its conversation key; ``extra_key``/``cache_salt`` its
        cache namespace."""
        ranks = self.ranks if among is None else [r for r in self.ranks if r in among]
        if not ranks:
            raise LookupError("no live rank to route to")
        if rid is None:
            rid = f"route-{next(self._rids)}"
        policy = self.policy
        c = Candidates(
            ranks=ranks,
            token_ids=token_ids,
            page_size=self.page_size,
            loads=self.loads,
            now=self.clock(),
            session=session if session is not None else cache_salt or extra_key,
            extra_key=extra_key,
            cache_salt=cache_salt,
        )
        if policy.uses_prefix:
            if policy.uses_pending:
                c.matched = self.pending.match(c.hashes, ranks, self.index)
                counted = self.pending.count_new
                c.cached_pages = self._cached_pages if counted else _uncounted_pages
            else:
                c.matched = self.index.match_hashes(c.hashes, ranks)
                c.cached_pages = self.index.num_blocks
        while len(self.loads) >= self.max_inflight:
            self.finished(self.loads.oldest())
            self.forgotten += 1
        rank, reason = policy.choose(c)
        matched = c.matched.get(rank, 0)
        self.loads.routed(rid, rank, len(token_ids), matched * self.page_size)
        if policy.uses_pending:
            self.pending.add(rid, rank, c.hashes, self.index)
        if self._on_routed is not None:
            self._on_routed(c, rank, rid)
        return Route(rank, matched, c.matched, reason)

    def prefilled(self, rid: str) -> None:
        """``rid``'s first token came back."""
        self.loads.prefilled(rid)
        self.pending.discard(rid)

    def finished(self, rid: str) -> None:
        """``rid`` ended on its worker (finished, failed or aborted)."""
        self.loads.finished(rid)
        self.pending.discard(rid)
        if self._on_finished is not None:
            self._on_finished(rid)

    def report(
        self, rank: int, *, kv_usage: float | None = None, waiting: int | None = None
    ) -> None:
        """A worker's own load figures (its ``KvMetrics`` or ``get_loads`` answer)."""
        self.loads.report(rank, kv_usage=kv_usage, waiting=waiting)
