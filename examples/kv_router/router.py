"""A KV-aware router: follows the KV-event stream of every data-parallel rank and sends each
request to the rank whose cache holds the longest prefix of it (``schedkit.router.KvRouter``
with its default ``longest_prefix`` policy; ``--policy kv`` for SGLang's cache-aware rule).

(Longer than 300 lines: the two demos, meant to be read and copied as one file.)

Run ``python examples/kv_router/router.py`` for a self-contained demo (two ranks, each a
RadixCache with a KvEventsPublisher, in this process), ``--schedulers`` for two schedulers
assembled from wiring.yaml as DP ranks 0 and 1 (in this process too), or point it at running
schedulers::

    python examples/kv_router/router.py --endpoint tcp://127.0.0.1:5557 \\
        --replay-endpoint tcp://127.0.0.1:5600 --dp-size 2 --page-size 16 < requests.txt

which routes one request per input line (token ids separated by spaces).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import attrs
import structlog

import schedkit
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.io.kv_events_publisher import KvEventsPublisher
from schedkit.components.metrics.reporter import SchedulerStats
from schedkit.core.parallel_state import ParallelState
from schedkit.kv_events import KvEventsConfig, KvIndex
from schedkit.router import POLICIES, KvRouter, Route, make_policy, rank_endpoints

# -- shared by the demos ---------------------------------------------------------------------


def free_port_bases(count: int) -> list[int]:
    """``count`` loopback ports p, each with p + 1 free too (base port + DP rank), none
    overlapping another: probed while every probe is held, so no two share a port."""
    held: list[socket.socket] = []
    bases: list[int] = []
    try:
        for _ in range(100 * count):
            first, second = socket.socket(), socket.socket()
            held += [first, second]
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            bases.append(port)
            if len(bases) == count:
                return bases
    finally:
        for probe in held:
            probe.close()
    raise OSError("no two consecutive free loopback ports found")


def demo_endpoints() -> tuple[KvEventsConfig, str]:
    """Base live and replay endpoints for two DP ranks, and a metrics endpoint, on free
    loopback ports."""
    live, replay, metrics = free_port_bases(3)
    config = KvEventsConfig(
        endpoint=f"tcp://127.0.0.1:{live}", replay_endpoint=f"tcp://127.0.0.1:{replay}"
    )
    return config, f"tcp://127.0.0.1:{metrics}"


def last_seq(publisher: KvEventsPublisher) -> int:
    """The seq of the last batch ``publisher`` sent (-1 before the first)."""
    publisher.flush()
    return publisher.published + publisher.dropped - 1


def caught_up(publishers: Sequence[KvEventsPublisher]) -> Callable[[KvRouter], bool]:
    """A ``KvRouter.sync`` condition: the router has applied every batch of every rank."""

    def done(router: KvRouter) -> bool:
        return all(router.subscribers[p.dp_rank].last_seq == last_seq(p) for p in publishers)

    return done


def go_live(router: KvRouter, ranks: Sequence[tuple[RadixCache, KvEventsPublisher]]) -> None:
    """Publish each (empty) cache's AllBlocksCleared until every subscription is live; a
    subscriber that joins late then replays the rest from seq 0."""
    deadline = time.monotonic() + 5
    while not all(sub.last_seq is not None for sub in router.subscribers.values()):
        if time.monotonic() > deadline:
            raise TimeoutError("the router's subscriptions never went live")
        for cache, publisher in ranks:
            cache.reset()
            publisher.publish_kv_events()
        router.poll(20)


def describe(name: str, route: Route, loads: Mapping[int, int]) -> str:
    """One routing decision as a line of the demo's output."""
    why = "tie on prefix, by load" if route.tie_break else "longest prefix"
    return f"{name:24s} -> rank {route.rank}  ({why}; pages {route.scores}, loads {dict(loads)})"


def tokens(seed: int, n: int) -> list[int]:
    """``n`` token ids that differ from other seeds' (a stand-in for a tokenized prompt)."""
    return [1000 * seed + i for i in range(n)]


# -- demo: two caches and publishers in this process ----------------------------------------


class DemoRank:
    """One DP rank's cache and publisher, with the stats its metrics report."""

    def __init__(self, rank: int, config: KvEventsConfig, metrics_endpoint: str) -> None:
        self.stats = SchedulerStats()
        self.cache = RadixCache(page_size=16, capacity=4096, enable_kv_cache_events=True)
        self.publisher = KvEventsPublisher(
            kv_events_config=config,
            parallel_state=ParallelState(dp_size=2, dp_rank=rank),
            tree_cache=self.cache,
            metrics_endpoint=metrics_endpoint,
            max_running_requests=16,
            max_total_num_tokens=4096,
            page_size=16,
            get_stats=lambda: self.stats,
        )

    def serve(self, token_ids: Iterable[int]) -> None:
        """Cache a finished request's tokens and publish the step's events."""
        self.cache.insert(list(token_ids))
        self.publisher.publish_kv_events()


def run_demo(out: Callable[[str], None] = print) -> list[tuple[str, Route]]:
    """Two ranks cache different system prompts; the router sends requests where their
    prefix is cached, and by load when no rank holds it. Returns (request, route) pairs."""
    config, metrics_endpoint = demo_endpoints()
    router = KvRouter(
        rank_endpoints(config.endpoint, config.replay_endpoint, 2),
        page_size=16,
        metrics_endpoint=metrics_endpoint,
    )
    ranks: list[DemoRank] = []
    decisions: list[tuple[str, Route]] = []

    def send(name: str, token_ids: list[int]) -> None:
        loads = {r: router.loads[r].requests for r in router.ranks}
        route = router.route(token_ids)
        decisions.append((name, route))
        out(describe(name, route, loads))

    try:
        ranks += [DemoRank(rank, config, metrics_endpoint) for rank in (0, 1)]
        go_live(router, [(rank.cache, rank.publisher) for rank in ranks])
        in_sync = caught_up([rank.publisher for rank in ranks])

        system_a, system_b = tokens(1, 64), tokens(2, 64)
        for i in range(3):
            ranks[0].serve(system_a + tokens(10 + i, 40))
            ranks[1].serve(system_b + tokens(20 + i, 40))
        router.sync(in_sync)
        out(f"index: rank 0 holds {len(router.index.blocks(0))} pages, "
            f"rank 1 holds {len(router.index.blocks(1))}")  # fmt: skip

        send("system A + question", system_a + tokens(30, 20))
        send("system B + question", system_b + tokens(31, 20))
        send("new prompt C", tokens(3, 80))
        send("new prompt D", tokens(4, 80))

        ranks[0].stats = SchedulerStats(num_running_reqs=6, num_queue_reqs=2)
        ranks[1].stats = SchedulerStats(num_running_reqs=1, num_queue_reqs=0)
        for rank in ranks:
            rank.publisher.emit_kv_metrics()
        router.sync(lambda r: len(r.reported) == 2)
        out("load reports: rank 0 = 8 requests, rank 1 = 1")
        send("new prompt E", tokens(5, 80))
        send("first half of system A", system_a[:32] + tokens(32, 40))

        ranks[0].cache.evict(4096)
        ranks[0].publisher.publish_kv_events()
        router.sync(in_sync)
        out(f"rank 0 evicted everything: it holds {len(router.index.blocks(0))} pages")
        send("system A again", system_a + tokens(33, 20))
    finally:
        router.close()
        for rank in ranks:
            rank.publisher.shutdown()
    return decisions


# -- demo: two schedulers assembled from wiring.yaml ----------------------------------------

WIRING = Path(__file__).resolve().parents[2] / "wiring.yaml"


@attrs.frozen
class Served:
    """One request of the scheduler demo: its system-prompt family and where it went."""

    family: str
    req: schedkit.Req
    route: Route


@attrs.frozen
class SchedulersRun:
    """What ``run_schedulers`` did: every request in order, the router's index after the
    last one, and each rank's tree cache (still readable after the schedulers shut down)."""

    served: list[Served]
    index: KvIndex
    caches: list[RadixCache]


def family_requests(
    families: str = "ABC", per_family: int = 4, system_len: int = 256, seed: int = 0
) -> list[tuple[str, schedkit.Req]]:
    """Requests that start with one of a few shared system prompts (one per letter of
    ``families``) and end with a question of their own, the families shuffled together."""
    rng = random.Random(seed)
    order = [family for family in families for _ in range(per_family)]
    rng.shuffle(order)
    numbers = dict.fromkeys(families, 0)
    requests = []
    for i, family in enumerate(order):
        numbers[family] += 1
        system = tokens(1 + families.index(family), system_len)
        question = tokens(10 + i, rng.randint(17, 60))
        req = schedkit.Req(
            rid=f"{family}{numbers[family]}",
            origin_input_ids=system + question,
            sampling_params=schedkit.SamplingParams(max_new_tokens=8),
        )
        requests.append((family, req))
    return requests


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the block, then restore what was there."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def build_schedulers(
    config: KvEventsConfig, dp_size: int, stack: contextlib.ExitStack
) -> list[schedkit.Assembly]:
    """One scheduler per DP rank from the default wiring, differing only by the rank in their
    parallel state; all get the same base endpoints, which each publisher offsets by its
    rank. ``stack`` shuts them down."""
    endpoints = {
        "SCHEDKIT_KV_EVENTS_ENDPOINT": config.endpoint,
        "SCHEDKIT_KV_REPLAY_ENDPOINT": config.replay_endpoint,
    }
    with environment(endpoints):  # wiring.yaml reads its KV-event endpoints from these
        wirings = [
            schedkit.load_wiring(
                WIRING,
                {"components": {"parallel_state": {"args": {"dp_size": dp_size, "dp_rank": rank}}}},
            )
            for rank in range(dp_size)
        ]
    return [stack.enter_context(schedkit.build(wiring)) for wiring in wirings]


def run_schedulers(
    out: Callable[[str], None] = print,
    requests: Sequence[tuple[str, schedkit.Req]] | None = None,
) -> SchedulersRun:
    """Route a stream of requests (default: ``family_requests()``) over two schedulers, one
    at a time: take in the ranks' events, route, submit, run both schedulers until idle.
    Prints each decision and a per-rank summary."""
    requests = family_requests() if requests is None else requests
    config, _ = demo_endpoints()
    served: list[Served] = []
    with contextlib.ExitStack() as stack:
        ranks = build_schedulers(config, 2, stack)
        publishers = [rank["kv_events_publisher"] for rank in ranks]
        router = KvRouter(
            rank_endpoints(config.endpoint, config.replay_endpoint, len(ranks)),
            page_size=ranks[0]["allocator"].page_size,  # hash pages as the caches do
            topic=publishers[0].kv_events_config.topic,
        )
        stack.callback(router.close)
        go_live(router, [(rank["tree_cache"], rank["kv_events_publisher"]) for rank in ranks])
        in_sync = caught_up(publishers)

        for family, req in requests:
            router.sync(in_sync)
            loads = {r: router.loads[r].requests for r in router.ranks}
            route = router.route(req.origin_input_ids)
            ranks[route.rank]["scheduler"].submit(req)
            for rank in ranks:
                rank["scheduler"].run_until_idle()
            name = f"{req.rid} (system {family})"
            cached = f"{req.cached_tokens} of {len(req.origin_input_ids)} prompt tokens cached"
            out(f"{describe(name, route, loads)}; {cached}")
            served.append(Served(family, req, route))

        router.sync(in_sync)
        for r, rank in enumerate(ranks):
            mine = [s for s in served if s.route.rank == r]
            families = ", ".join(sorted({s.family for s in mine})) or "none"
            cached = sum(s.req.cached_tokens for s in mine)
            prompt = sum(len(s.req.origin_input_ids) for s in mine)
            hit_rate = rank["metrics_reporter"].stats.cache_hit_rate
            cache = rank["tree_cache"]
            out(
                f"rank {r}: {len(mine)} requests (system {families}), {cached} of {prompt} "
                f"prompt tokens cached (hit rate {hit_rate:.0%}); the cache holds "
                f"{cache.total_size() // cache.page_size} pages, the router's index "
                f"{len(router.index.blocks(r))}"
            )
    return SchedulersRun(served, router.index, [rank["tree_cache"] for rank in ranks])


def follow(args: argparse.Namespace) -> int:
    """Route requests read from stdin against running schedulers."""
    router = KvRouter(
        rank_endpoints(args.endpoint, args.replay_endpoint, args.dp_size),
        args.page_size,
        metrics_endpoint=args.metrics_endpoint,
        policy=make_policy(args.policy),
    )
    try:
        deadline = time.monotonic() + args.warmup  # learn what the ranks hold already
        while time.monotonic() < deadline:
            router.poll(10)
        for line in sys.stdin:
            if not line.strip():
                continue
            router.poll(0)
            route = router.route([int(t) for t in line.split()])
            print(f"rank {route.rank} matched_pages={route.matched_pages} scores={route.scores}")
    finally:
        router.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--endpoint", help="rank 0's live endpoint; omit for a demo")
    parser.add_argument("--replay-endpoint", help="rank 0's replay endpoint")
    parser.add_argument("--metrics-endpoint", help="endpoint to bind for KvMetrics (PULL)")
    parser.add_argument("--dp-size", type=int, default=2)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument(
        "--policy", choices=sorted(POLICIES), default="longest_prefix", help="routing policy"
    )
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds to follow the streams before routing"
    )
    parser.add_argument(
        "--schedulers",
        action="store_true",
        help="demo: route over two schedulers assembled from wiring.yaml in this process",
    )
    args = parser.parse_args(argv)
    if args.schedulers and args.endpoint is not None:
        parser.error("--schedulers runs its own schedulers; leave out --endpoint")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.schedulers:
        run_schedulers()
        return 0
    if args.endpoint is None:
        run_demo()
        return 0
    return follow(args)


if __name__ == "__main__":
    sys.exit(main())
