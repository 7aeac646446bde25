"""Routing requests over a fleet of schedulers (data-parallel ranks).

A ``Router`` keeps a ``KvIndex`` of what every rank's prefix cache holds (fed with the ranks'
KV events) and asks a routing policy where each request goes, given how many leading pages
of its prompt each rank holds and each rank's load. ``KvRouter`` is a ``Router`` that follows
the ranks' KV-event streams over ZeroMQ itself (one ``KvEventSubscriber`` per rank, recovering
through replay) and reads their ``KvMetrics`` load reports.

Policies (``POLICIES``):

- ``kv``: SGLang model gateway's cache-aware rule (``sgl-model-gateway/src/policies/
  cache_aware.rs``, ``select_worker``). When the load is imbalanced, ``max - min >
  balance_abs_threshold`` and ``max > min * balance_rel_threshold`` (both strict), the least
  loaded rank (the first in rank order among equals). Otherwise the longest prefix match if its
  match rate (matched tokens / prompt tokens) is ``> cache_threshold``, else the rank whose
  cache holds the fewest pages ("smallest tree"). The defaults 0.3 / 64 / 1.5 are the gateway's
  command-line defaults (``src/main.rs``); its library ``CacheAwareConfig::default()`` has
  0.5 / 32 / 1.1. Unlike the gateway, which guesses each worker's cache from the requests it
  sent, the index here holds what the workers report in their KV events, so a request's prefix
  counts once the worker has published it. Ties (same match, same cache size) go to the least
  loaded rank, then the lowest.
- ``round_robin``: the live ranks in turn.
- ``least_loaded``: the rank with the fewest requests in flight, the lowest among equals.
- ``longest_prefix``: the most matched pages; ties to the least loaded, then the rank chosen
  least recently (the KV-router example's rule).

(Longer than 300 lines: the policies, the router and the router that follows the event
streams share ``Route`` and ``Candidates`` and are read together.)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs
import msgspec
import structlog
import zmq

from schedkit.kv_events import (
    HistoryLost,
    KvEventSubscriber,
    KvIndex,
    Notice,
    PublisherRestarted,
    offset_endpoint,
)
from schedkit.kv_events.replay_client import ReplayBounds
from schedkit.kv_events.structs import KvMetrics

__all__ = [
    "POLICIES",
    "CacheAware",
    "Candidates",
    "KvRouter",
    "LeastLoaded",
    "LongestPrefix",
    "RoundRobin",
    "Route",
    "Router",
    "RoutingPolicy",
    "batches_after_break",
    "make_policy",
    "rank_endpoints",
]

log = structlog.get_logger(__name__)

_MAX_REPORT_BYTES = 1024  # a KvMetrics report is ~60 bytes
_APPLY_SECONDS = 0.01  # index work per KvRouter.poll; the rest waits for the next call
# What one replay answer may make the router hold (its hashes, ~40 bytes each): a replay
# of 10,000 batches of 64 pages is 26 MB.
_REPLAY_HELD_BYTES = 32 << 20


@attrs.frozen
class Route:
    """Where a request went and why: matched pages per rank and the rule that decided."""

    rank: int
    matched_pages: int
    scores: dict[int, int]
    reason: str

    @property
    def tie_break(self) -> bool:
        """True when equal prefixes left the choice to load."""
        return self.reason == "tie"


@attrs.frozen
class Candidates:
    """What a policy sees of one request: the live ranks in order, the leading pages of the
    prompt each holds (empty for policies that do not look), their loads, how many pages
    each rank's cache holds, and the prompt's length in tokens and the page size."""

    ranks: list[int]
    matched: dict[int, int]
    loads: dict[int, int]
    cached_pages: Callable[[int], int]
    prompt_tokens: int
    page_size: int


class RoutingPolicy(Protocol):
    """Chooses a rank from ``Candidates``; ``uses_prefix`` False spares the prefix lookup."""

    uses_prefix: bool

    def choose(self, c: Candidates) -> tuple[int, str]: ...


@attrs.define(kw_only=True)
class CacheAware:
    """SGLang model gateway's ``cache_aware`` rule (see the module docstring)."""

    cache_threshold: float = attrs.field(
        default=0.3, validator=[attrs.validators.ge(0), attrs.validators.le(1)]
    )
    balance_abs_threshold: int = attrs.field(default=64, validator=attrs.validators.ge(0))
    balance_rel_threshold: float = attrs.field(default=1.5, validator=attrs.validators.ge(0))
    uses_prefix: bool = attrs.field(default=True, init=False)

    def choose(self, c: Candidates) -> tuple[int, str]:
        loads = c.loads
        max_load, min_load = max(loads.values()), min(loads.values())
        if (
            max_load - min_load > self.balance_abs_threshold
            and max_load > min_load * self.balance_rel_threshold
        ):
            return min(c.ranks, key=loads.__getitem__), "imbalanced"
        best = max(c.matched.values(), default=0)
        rate = best * c.page_size / c.prompt_tokens if c.prompt_tokens else 0.0
        if rate > self.cache_threshold:
            tied = [r for r in c.ranks if c.matched.get(r, 0) == best]
            return min(tied, key=loads.__getitem__), "prefix"
        return min(c.ranks, key=lambda r: (c.cached_pages(r), loads[r])), "smallest_cache"


@attrs.define
class RoundRobin:
    """The live ranks in turn."""

    uses_prefix: bool = attrs.field(default=False, init=False)
    _turn: int = attrs.field(default=0, init=False)

    def choose(self, c: Candidates) -> tuple[int, str]:
        rank = c.ranks[self._turn % len(c.ranks)]
        self._turn += 1
        return rank, "round_robin"


@attrs.define
class LeastLoaded:
    """The rank with the fewest requests in flight (the lowest rank among equals)."""

    uses_prefix: bool = attrs.field(default=False, init=False)

    def choose(self, c: Candidates) -> tuple[int, str]:
        return min(c.ranks, key=c.loads.__getitem__), "least_loaded"


@attrs.define
class LongestPrefix:
    """The most matched pages; ties to the least loaded, then the rank chosen least recently."""

    uses_prefix: bool = attrs.field(default=True, init=False)
    _last_chosen: dict[int, int] = attrs.field(factory=dict, init=False)
    _routes: int = attrs.field(default=0, init=False)

    def choose(self, c: Candidates) -> tuple[int, str]:
        best = max(c.matched.get(r, 0) for r in c.ranks)
        tied = [r for r in c.ranks if c.matched.get(r, 0) == best]
        rank = min(tied, key=lambda r: (c.loads[r], self._last_chosen.get(r, -1)))
        self._last_chosen[rank] = self._routes
        self._routes += 1
        return rank, "tie" if len(tied) > 1 else "prefix"


POLICIES: dict[str, Callable[[], RoutingPolicy]] = {
    "kv": CacheAware,
    "round_robin": RoundRobin,
    "least_loaded": LeastLoaded,
    "longest_prefix": LongestPrefix,
}


def make_policy(name: str, **settings: float) -> RoutingPolicy:
    """A fresh policy called ``name`` (a key of ``POLICIES``) with ``settings`` (``kv``:
    ``cache_threshold``, ``balance_abs_threshold``, ``balance_rel_threshold``)."""
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; valid: {', '.join(POLICIES)}")
    try:
        return POLICIES[name](**settings)
    except TypeError:
        raise ValueError(
            f"routing policy {name!r} takes no {', '.join(map(repr, settings))}"
            + ("; kv takes cache_threshold, balance_abs_threshold, balance_rel_threshold")
        ) from None


class Router:
    """Routes token sequences to the live ranks with ``policy``, from a ``KvIndex`` fed with
    the ranks' KV events and a ``load(rank)`` function.

    ``remove(rank)`` takes a rank out (a dead worker): it is never chosen again and its
    blocks leave the index.
    """

    def __init__(
        self,
        ranks: Sequence[int],
        page_size: int,
        policy: RoutingPolicy,
        load: Callable[[int], int],
        index: KvIndex | None = None,
    ) -> None:
        if not ranks:
            raise ValueError("a router needs at least one rank")
        self.ranks = sorted(ranks)
        self.page_size = page_size
        self.policy = policy
        self.load = load
        self.index = KvIndex() if index is None else index

    def remove(self, rank: int) -> None:
        """Route nothing more to ``rank`` and forget what it cached."""
        if rank in self.ranks:
            self.ranks.remove(rank)
        self.index.clear_rank(rank)

    def route(self, token_ids: Sequence[int], among: Sequence[int] | None = None) -> Route:
        """Choose the live rank for a request (only from ``among``, when given: e.g. the
        ranks with room under admission control); LookupError when no rank is left."""
        ranks = self.ranks if among is None else [r for r in self.ranks if r in among]
        if not ranks:
            raise LookupError("no live rank to route to")
        matched = {}
        if self.policy.uses_prefix:
            found = self.index.match(token_ids, self.page_size)
            matched = {rank: found.get(rank, 0) for rank in ranks}
        candidates = Candidates(
            ranks=ranks,
            matched=matched,
            loads={rank: self.load(rank) for rank in ranks},
            cached_pages=self.index.num_blocks,
            prompt_tokens=len(token_ids),
            page_size=self.page_size,
        )
        rank, reason = self.policy.choose(candidates)
        return Route(rank, matched.get(rank, 0), matched, reason)


def rank_endpoints(
    endpoint: str, replay_endpoint: str | None, dp_size: int
) -> dict[int, tuple[str, str | None]]:
    """Each DP rank's (live, replay) endpoints: base port + rank, as the publishers bind them."""
    return {
        rank: (
            offset_endpoint(endpoint, rank),
            None if replay_endpoint is None else offset_endpoint(replay_endpoint, rank),
        )
        for rank in range(dp_size)
    }


def batches_after_break(notice: Notice, last_seq: int | None, batches: list) -> list:
    """The batches of one poll that follow a stream break (``last_seq``: the last seq the
    subscriber had applied when it reported the break)."""
    if isinstance(notice, HistoryLost):  # same stream: the seq only rises
        return [item for item in batches if last_seq is None or item[0] > last_seq]
    for i in range(1, len(batches)):  # a restart: the new stream starts where the seq drops
        if batches[i][0] <= batches[i - 1][0]:
            return batches[i:]
    return batches


class KvRouter(Router):
    """A ``Router`` that follows every rank's KV-event stream over ZeroMQ.

    One ``KvEventSubscriber`` per rank feeds the shared ``KvIndex``; lost history or a
    publisher restart clears that rank's blocks. Without a ``load`` function, a rank's load
    is what it last reported on the metrics socket (running + waiting requests; the router
    binds ``metrics_endpoint`` as a PULL socket) plus the requests routed to it since. A
    report that does not decode as ``KvMetrics`` is dropped and counted in ``bad_reports``.

    Each rank's index holds at most its pool: ``capacity`` (pages per rank, from the ranks'
    config) or its reported ``kv_total_blocks``; a rank that keeps storing past it
    (``KvIndex.violating``) is taken out of routing and listed in ``untrusted``. One
    ``poll`` applies ~10 ms of batches; a rank with more (a long replay) keeps the rest for
    the next calls and is not read meanwhile.
    """

    def __init__(
        self,
        endpoints: Mapping[int, tuple[str, str | None]],
        page_size: int,
        *,
        metrics_endpoint: str | None = None,
        topic: str = "",
        profile: str = "sglang",
        policy: RoutingPolicy | None = None,
        load: Callable[[int], int] | None = None,
        capacity: Mapping[int, int] | None = None,
    ) -> None:
        super().__init__(
            list(endpoints),
            page_size,
            LongestPrefix() if policy is None else policy,
            self.reported_load if load is None else load,
        )
        self.notices: list[tuple[int, Notice]] = []
        self.reported: dict[int, KvMetrics] = {}
        self.routed_since_report = dict.fromkeys(self.ranks, 0)
        self.bad_reports = 0
        self.untrusted: list[int] = []
        for rank, pages in (capacity or {}).items():
            self.index.set_capacity(rank, pages)
        self._breaks: dict[int, list] = {rank: [] for rank in self.ranks}
        self._backlog: dict[int, deque] = {rank: deque() for rank in self.ranks}
        self._context = zmq.Context()
        self._metrics = None
        self._decode_metrics = msgspec.msgpack.Decoder(KvMetrics).decode
        self.subscribers: dict[int, KvEventSubscriber] = {}
        try:
            for rank, (live, replay) in endpoints.items():
                self.subscribers[rank] = KvEventSubscriber(
                    live,
                    replay,
                    topic,
                    profile,
                    context=self._context,
                    on_notice=self._notice_handler(rank),
                    keep_tokens=False,
                    replay_bounds=ReplayBounds(max_bytes=_REPLAY_HELD_BYTES),
                )
            if metrics_endpoint is not None:
                self._metrics = self._context.socket(zmq.PULL)
                self._metrics.setsockopt(zmq.MAXMSGSIZE, _MAX_REPORT_BYTES)
                self._metrics.setsockopt(zmq.RCVHWM, 1000)
                self._metrics.bind(metrics_endpoint)
        except BaseException:
            self.close()
            raise

    def _notice_handler(self, rank: int) -> Callable[[Notice], None]:
        def handle(notice: Notice) -> None:
            self.notices.append((rank, notice))
            if isinstance(notice, (HistoryLost, PublisherRestarted)):
                self._breaks[rank].append((notice, self.subscribers[rank].last_seq))

        return handle

    def poll(self, timeout_ms: int = 0) -> int:
        """Apply what every live rank has published and read load reports; returns the
        number of batches applied."""
        applied = 0
        first = self.ranks[0] if self.ranks else None
        for rank in self.ranks:
            backlog = self._backlog[rank]
            if backlog:  # read on once it is applied: meanwhile the sockets' queues hold
                continue
            batches = self.subscribers[rank].poll(timeout_ms if rank == first else 0)
            breaks, self._breaks[rank] = self._breaks[rank], []
            for notice, last_seq in breaks:
                self.index.clear_rank(rank)
                batches = batches_after_break(notice, last_seq, batches)
            backlog.extend(batches)
        # Applying a long replay (up to ReplayBounds) takes turns with the next polls.
        start = time.monotonic()
        ranks = list(self.ranks)
        for i, rank in enumerate(ranks, 1):
            backlog, until = self._backlog[rank], start + _APPLY_SECONDS * i / len(ranks)
            while backlog and (time.monotonic() < until or not applied):
                self.index.apply(backlog.popleft()[1], rank)
                applied += 1
            if self.index.violating(rank):
                violations = self.index.violations(rank)
                log.warning("router.rank_untrusted", rank=rank, violations=violations)
                self.untrusted.append(rank)
                self.remove(rank)
        while self._metrics is not None and self._metrics.poll(0):
            try:
                report = self._decode_metrics(self._metrics.recv())
            except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
                self.bad_reports += 1
                if self.bad_reports == 1:
                    log.warning("router.bad_load_report", error=str(exc)[:200])
                continue
            rank = report.data_parallel_rank
            if rank in self.routed_since_report and rank in self.subscribers:
                self.reported[rank] = report
                self.routed_since_report[rank] = 0
                self.index.set_capacity(rank, report.kv_total_blocks)
        return applied

    def sync(self, done: Callable[[KvRouter], bool], timeout: float = 5.0) -> None:
        """Poll until ``done(self)``; TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not done(self):
            if time.monotonic() > deadline:
                raise TimeoutError(f"router not in sync after {timeout}s")
            self.poll(10)

    def reported_load(self, rank: int) -> int:
        """Requests running or waiting on ``rank`` as last reported, plus those routed since."""
        report = self.reported.get(rank)
        if report is None:
            return self.routed_since_report[rank]
        busy = report.request_active_slots + report.num_requests_waiting
        return busy + self.routed_since_report[rank]

    def route(self, token_ids: Sequence[int], among: Sequence[int] | None = None) -> Route:
        """Choose the rank for a request and count it against that rank's load."""
        route = super().route(token_ids, among)
        self.routed_since_report[route.rank] += 1
        return route

    def remove(self, rank: int) -> None:
        """Stop following ``rank``'s stream and route nothing more to it."""
        super().remove(rank)
        self._backlog.pop(rank, None)
        subscriber = self.subscribers.pop(rank, None)
        if subscriber is not None:
            subscriber.close()

    def close(self) -> None:
        """Close every socket."""
        for sub in self.subscribers.values():
            sub.close()
        if self._metrics is not None:
            self._metrics.close(linger=0)
        self._context.term()
