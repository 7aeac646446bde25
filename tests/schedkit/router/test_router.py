"""Routing policies and the Router over a KvIndex fed with real event batches."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from schedkit.fleet.offline import run_offline
from schedkit.kv_events import AllBlocksCleared, HistoryLost, KVEventBatch, PublisherRestarted
from schedkit.router import KvCacheAware, KvRouter, RoundRobin, Router, batches_after_break
from schedkit.testing.serving import free_endpoint
from schedkit.workloads.traces import open_trace
from tests.schedkit.router.helpers import PAGE, stored


def test_router_routes_by_what_the_events_say_and_around_a_removed_rank():
    router = Router([0, 1, 2], PAGE, KvCacheAware(fallback="smallest_cache"))
    prompt = list(range(100, 116))
    router.index.apply(stored(prompt[:12]), 2)
    route = router.route(prompt)
    assert (route.rank, route.matched_pages, route.reason) == (2, 3, "prefix")
    assert route.scores == {0: 0, 1: 0, 2: 3}

    router.remove(2)
    assert router.index.num_blocks(2) == 0
    route = router.route(prompt)
    assert route.rank in (0, 1) and route.reason == "smallest_cache"
    assert router.loads.rank_of("route-1") == route.rank
    router.remove(0)
    router.remove(1)
    with pytest.raises(LookupError, match="no live rank"):
        router.route(prompt)


def test_router_skips_the_prefix_lookup_for_load_only_policies():
    router = Router([0, 1], PAGE, RoundRobin())
    router.index.apply(stored(list(range(8))), 1)
    route = router.route(list(range(8)))
    assert (route.rank, route.scores) == (0, {})
    router.index.apply(KVEventBatch(ts=0.0, events=[AllBlocksCleared()]), 1)
    assert router.index.num_blocks(1) == 0


def test_router_needs_a_rank():
    with pytest.raises(ValueError, match="at least one rank"):
        Router([], PAGE, RoundRobin())


def test_batches_after_a_break_are_kept():
    batches = [(seq, None) for seq in (4, 5, 9, 10)]
    assert batches_after_break(HistoryLost(6, 9), 5, batches) == batches[2:]
    assert batches_after_break(HistoryLost(0, None), None, batches) == batches
    restarted = [(seq, None) for seq in (7, 8, 0, 1)]
    assert batches_after_break(PublisherRestarted(8, 1), 8, restarted) == restarted[2:]
    assert batches_after_break(PublisherRestarted(8, 1), 8, restarted[2:]) == restarted[2:]


def test_kv_router_drops_a_load_report_that_does_not_decode():
    metrics = free_endpoint()
    kv = KvRouter({0: (free_endpoint(), None)}, PAGE, metrics_endpoint=metrics)
    push = zmq.Context.instance().socket(zmq.PUSH)
    try:
        push.connect(metrics)
        push.send(b"not msgpack at all \xc1")
        # A report naming a rank the router was not given (the last field).
        push.send(msgspec.msgpack.encode(["KvMetrics", 3, 8, 10, 100, 2, 0.1, 0.5, 7]))
        # SGLang's KvMetrics on the wire: a tagged msgpack array.
        push.send(msgspec.msgpack.encode(["KvMetrics", 3, 8, 10, 100, 2, 0.1, 0.5, 0]))
        deadline = time.monotonic() + 5
        while 0 not in kv.reported:
            assert time.monotonic() < deadline
            kv.poll(10)
        assert kv.bad_reports == 1 and kv.unknown_rank_reports == 1 and 7 not in kv.reported
        assert kv.reported_load(0) == 5  # 3 running + 2 waiting
        assert (kv.loads[0].kv_usage, kv.loads[0].reported_waiting) == (0.1, 2)
    finally:
        push.close(linger=0)
        kv.close()


def test_kv_router_that_cannot_bind_its_metrics_socket_raises_and_closes():
    taken = zmq.Context.instance().socket(zmq.PULL)
    try:
        endpoint = free_endpoint()
        taken.bind(endpoint)
        with pytest.raises(zmq.ZMQError):
            KvRouter({0: (free_endpoint(), None)}, PAGE, metrics_endpoint=endpoint)
    finally:
        taken.close(linger=0)


def test_kv_sees_prompts_routed_but_not_yet_prefilled():
    router = Router([0, 1, 2], PAGE, KvCacheAware())
    prompt = list(range(100, 116))
    first = router.route(prompt, rid="a")
    assert (first.rank, first.reason) == (0, "least_prefill")
    # Nothing published yet, but the same prompt follows the first to its worker.
    second = router.route(prompt, rid="b")
    assert (second.rank, second.matched_pages, second.reason) == (0, 4, "prefix")
    # Once both are prefilled the worker has published the pages; until then they count.
    router.prefilled("a")
    router.prefilled("b")
    third = router.route(prompt, rid="c")  # nothing in the index: the least prefill queued
    assert (third.rank, third.reason) == (1, "least_prefill")
    router.finished("c")
    router.index.apply(stored(prompt), 0)
    fourth = router.route(prompt, rid="d")
    assert (fourth.rank, fourth.matched_pages, fourth.reason) == (0, 4, "prefix")


def test_the_smallest_cache_fallback_does_not_feed_on_itself():
    """A worker that just evicted everything has the fewest pages in the event-fed index; the
    pages routed to it count at once, so it is not chosen for every request after."""
    router = Router([0, 1, 2], PAGE, KvCacheAware(fallback="smallest_cache"))
    router.index.apply(stored(list(range(500, 520))), 1)  # 5 pages
    router.index.apply(stored(list(range(600, 620))), 2)
    ranks = [router.route(list(range(k * 100, k * 100 + 16))).rank for k in range(1, 5)]
    assert ranks == [0, 0, 1, 2]  # 0 pages, then 4 (< 5), then 8 (> 5)
    assert router.pending.num_pages(0) == 8


def test_router_load_board_follows_each_request():
    router = Router([0, 1], PAGE, RoundRobin())
    router.index.apply(stored(list(range(8))), 0)
    router.route(list(range(10)), rid="a")  # to 0: 10 prompt tokens
    router.route(list(range(6)), rid="b")  # to 1
    loads = router.loads
    assert (loads[0].requests, loads[0].queued, loads[0].prefill_tokens) == (1, 1, 10)
    router.prefilled("a")
    assert (loads[0].queued, loads[0].prefill_tokens, loads[0].decode_tokens) == (0, 0, 10)
    router.finished("a")
    router.finished("b")
    router.finished("b")  # twice: no-op
    assert [(w.requests, w.tokens) for w in loads.workers.values()] == [(0, 0), (0, 0)]
    router.report(1, kv_usage=0.25, waiting=3)
    assert (loads[1].kv_usage, loads[1].reported_waiting) == (0.25, 3)


def test_an_offline_fleet_keeps_a_conversation_on_its_worker(tmp_path):
    lines = [
        json.dumps({"prompt_len": 40, "max_new_tokens": 4, "arrival": i / 100, "routing_key": key})
        for i, key in enumerate("aabaaab")
    ]
    trace = tmp_path / "conversations.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    wiring = Path(__file__).resolve().parents[3] / "wiring.yaml"
    summary = run_offline(wiring, open_trace(trace, "jsonl"), 3, "session")
    assert sorted(w.requests_routed for w in summary.workers) == [0, 2, 5]


def test_a_router_whose_driver_never_reports_ends_keeps_a_bounded_number():
    router = Router([0, 1], PAGE, KvCacheAware(), max_inflight=3)
    for i in range(5):
        router.route(list(range(i * 16, i * 16 + 16)), rid=str(i))
    assert len(router.loads) == 3 and router.forgotten == 2
    assert router.loads.rank_of("0") is None and len(router.pending) == 3
