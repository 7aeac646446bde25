"""``KvRouter``: a ``Router`` that follows every rank's KV-event stream over ZeroMQ itself (one
``KvEventSubscriber`` per rank, recovering through replay) and reads the ranks' ``KvMetrics``
load reports; plus the helpers for its endpoints and stream breaks."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

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
from schedkit.kv_events.index import DEFAULT_UNANNOUNCED_PAGES
from schedkit.kv_events.replay_client import ReplayBounds
from schedkit.kv_events.structs import KvMetrics
from schedkit.router.base import Route, RoutingPolicy
from schedkit.router.router import Router
from schedkit.router.simple import LongestPrefix

__all__ = ["KvRouter", "batches_after_break", "rank_endpoints"]

log = structlog.get_logger(__name__)

_MAX_REPORT_BYTES = 1024  # a KvMetrics report is ~60 bytes
_APPLY_SECONDS = 0.01  # index work per KvRouter.poll; the rest waits for the next call
# What one replay answer may make the router hold (its hashes, ~40 bytes each): a replay
# of 10,000 batches of 64 pages is 26 MB.
_REPLAY_HELD_BYTES = 32 << 20


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
    publisher restart clears that rank's blocks. With ``metrics_endpoint`` the router binds a
    PULL socket there and reads each rank's ``KvMetrics``: its KV usage and waiting requests go
    to the load board (``report``) and its running + waiting requests replace the requests in
    flight the router counted (requests routed since add to them); the last report per rank
    stays in ``reported``. A report
    that does not decode as ``KvMetrics`` is dropped and counted in ``bad_reports``, one from a
    rank the router was not given in ``unknown_rank_reports`` (the first of each logged); a
    rank taken out of routing has its reports ignored.

    Each rank's index holds at most its pool: ``capacity`` (pages per rank, from the ranks'
    config) or its reported ``kv_total_blocks``; a rank that keeps storing past it
    (``KvIndex.violating``) is taken out of routing and listed in ``untrusted``. A rank whose
    pool is not known yet is indexed up to ``unannounced_pages`` and routed as usual. One
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
        clock: Callable[[], float] = time.monotonic,
        capacity: Mapping[int, int] | None = None,
        unannounced_pages: int = DEFAULT_UNANNOUNCED_PAGES,
    ) -> None:
        super().__init__(
            list(endpoints),
            page_size,
            LongestPrefix() if policy is None else policy,
            KvIndex(unannounced_pages=unannounced_pages),
            clock=clock,
        )
        self.notices: list[tuple[int, Notice]] = []
        self.reported: dict[int, KvMetrics] = {}
        self.routed_since_report = dict.fromkeys(self.ranks, 0)
        self.bad_reports = 0
        self.unknown_rank_reports = 0
        self.untrusted: list[int] = []
        for rank, pages in (capacity or {}).items():
            self.index.set_capacity(rank, pages)
        self._backlog: dict[int, deque] = {rank: deque() for rank in self.ranks}
        self._breaks: dict[int, list] = {rank: [] for rank in self.ranks}
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
            if rank not in self.routed_since_report:  # not a rank this router follows
                self.unknown_rank_reports += 1
                if self.unknown_rank_reports == 1:
                    log.warning("router.load_report_unknown_rank", rank=rank, ranks=self.ranks)
            elif rank in self.subscribers:
                self.reported[rank] = report
                self.routed_since_report[rank] = 0
                self.report(
                    rank, kv_usage=report.gpu_cache_usage_perc, waiting=report.num_requests_waiting
                )
                # The worker's own count replaces the router's: requests routed since add to it.
                self.loads[rank].requests = (
                    report.request_active_slots + report.num_requests_waiting
                )
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

    def route(
        self,
        token_ids: Sequence[int],
        among: Sequence[int] | None = None,
        **request: str | None,
    ) -> Route:
        """Choose the rank for a request (``Router.route``) and count it as routed since the
        rank's last report."""
        route = super().route(token_ids, among, **request)
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
