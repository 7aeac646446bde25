"""Routing policies and the Router over a KvIndex fed with real event batches."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq

from schedkit.kv_events import (
    AllBlocksCleared,
    BlockStored,
    HistoryLost,
    KVEventBatch,
    PublisherRestarted,
    page_hashes,
)
from schedkit.router import (
    POLICIES,
    CacheAware,
    Candidates,
    KvRouter,
    LeastLoaded,
    LongestPrefix,
    RoundRobin,
    Router,
    batches_after_break,
    make_policy,
)
from schedkit.testing.serving import free_endpoint

PAGE = 4


def candidates(matched, loads, cached=None, prompt_tokens=16):
    cached = cached or {}
    return Candidates(
        ranks=sorted(loads),
        matched=matched,
        loads=loads,
        cached_pages=lambda r: cached.get(r, 0),
        prompt_tokens=prompt_tokens,
        page_size=PAGE,
    )


def test_cache_aware_routes_to_the_least_loaded_when_imbalanced():
    policy = CacheAware(balance_abs_threshold=4, balance_rel_threshold=1.5)
    # max - min = 5 > 4 and 10 > 5 * 1.5: imbalanced, whatever the prefix says.
    assert policy.choose(candidates({0: 4, 1: 0, 2: 0}, {0: 10, 1: 5, 2: 6})) == (1, "imbalanced")
    # Both comparisons are strict: a spread of exactly 4, or max == min * rel, is balanced.
    assert policy.choose(candidates({0: 4, 1: 0}, {0: 8, 1: 4}))[1] == "prefix"
    assert policy.choose(candidates({0: 4, 1: 0}, {0: 15, 1: 10}))[1] == "prefix"
    # Equal least loads: the first in rank order, as Rust's min_by_key.
    assert policy.choose(candidates({}, {0: 20, 1: 2, 2: 2})) == (1, "imbalanced")


def test_cache_aware_prefix_above_the_threshold_else_the_smallest_cache():
    policy = CacheAware(cache_threshold=0.5)
    # 3 pages of 4 tokens out of 16 prompt tokens: rate 0.75 > 0.5.
    assert policy.choose(candidates({0: 1, 1: 3}, {0: 0, 1: 3})) == (1, "prefix")
    # Exactly 0.5 is not above the threshold: the rank whose cache holds the fewest pages.
    assert policy.choose(candidates({0: 2, 1: 0}, {0: 0, 1: 0}, {0: 9, 1: 5})) == (
        1,
        "smallest_cache",
    )
    # Equal caches: the less loaded, then the lower rank.
    assert policy.choose(candidates({0: 0, 1: 0}, {0: 2, 1: 1}, {0: 3, 1: 3})) == (
        1,
        "smallest_cache",
    )
    # Equal best matches: the less loaded of them.
    assert policy.choose(candidates({0: 3, 1: 3, 2: 0}, {0: 2, 1: 1, 2: 0}))[0] == 1


def test_cache_aware_defaults_are_the_gateway_command_line_defaults():
    policy = CacheAware()
    assert (
        policy.cache_threshold,
        policy.balance_abs_threshold,
        policy.balance_rel_threshold,
    ) == (0.3, 64, 1.5)


def test_round_robin_takes_the_live_ranks_in_turn():
    policy = RoundRobin()
    picks = [policy.choose(candidates({}, {0: 9, 1: 0, 2: 0}))[0] for _ in range(4)]
    assert picks == [0, 1, 2, 0]


def test_least_loaded_and_longest_prefix():
    assert LeastLoaded().choose(candidates({}, {0: 3, 1: 1, 2: 1})) == (1, "least_loaded")
    policy = LongestPrefix()
    assert policy.choose(candidates({0: 2, 1: 1}, {0: 5, 1: 0})) == (0, "prefix")
    assert policy.choose(candidates({0: 0, 1: 0}, {0: 0, 1: 0})) == (1, "tie")  # 0 went last
    assert policy.choose(candidates({0: 0, 1: 0}, {0: 0, 1: 0})) == (0, "tie")


def test_make_policy_names_the_valid_ones():
    assert set(POLICIES) == {"kv", "round_robin", "least_loaded", "longest_prefix"}
    assert isinstance(make_policy("kv"), CacheAware)
    with pytest.raises(ValueError, match="unknown routing policy 'kvv'; valid: kv, round_robin"):
        make_policy("kvv")
    library = make_policy(
        "kv", cache_threshold=0.5, balance_abs_threshold=32, balance_rel_threshold=1.1
    )
    assert (library.cache_threshold, library.balance_abs_threshold) == (0.5, 32)
    with pytest.raises(ValueError, match="'round_robin' takes no 'cache_threshold'; kv takes"):
        make_policy("round_robin", cache_threshold=0.5)
    with pytest.raises(ValueError, match="'cache_threshold' must be <= 1"):
        make_policy("kv", cache_threshold=1.5)


def stored(tokens: list[int]) -> KVEventBatch:
    hashes = page_hashes(tokens, PAGE)
    parents = [None, *hashes[:-1]]
    events = [
        BlockStored([h], parent, tokens[i * PAGE : (i + 1) * PAGE], PAGE, None, "GPU")
        for i, (h, parent) in enumerate(zip(hashes, parents, strict=True))
    ]
    return KVEventBatch(ts=0.0, events=events)


def test_router_routes_by_what_the_events_say_and_around_a_removed_rank():
    loads = {0: 0, 1: 0, 2: 0}
    router = Router([0, 1, 2], PAGE, CacheAware(), loads.__getitem__)
    prompt = list(range(100, 116))
    router.index.apply(stored(prompt[:12]), 2)
    route = router.route(prompt)
    assert (route.rank, route.matched_pages, route.reason) == (2, 3, "prefix")
    assert route.scores == {0: 0, 1: 0, 2: 3}

    router.remove(2)
    assert router.index.num_blocks(2) == 0
    route = router.route(prompt)
    assert route.rank in (0, 1) and route.reason == "smallest_cache"
    router.remove(0)
    router.remove(1)
    with pytest.raises(LookupError, match="no live rank"):
        router.route(prompt)


def test_router_skips_the_prefix_lookup_for_load_only_policies():
    router = Router([0, 1], PAGE, RoundRobin(), lambda rank: 0)
    router.index.apply(stored(list(range(8))), 1)
    route = router.route(list(range(8)))
    assert (route.rank, route.scores) == (0, {})
    router.index.apply(KVEventBatch(ts=0.0, events=[AllBlocksCleared()]), 1)
    assert router.index.num_blocks(1) == 0


def test_router_needs_a_rank():
    with pytest.raises(ValueError, match="at least one rank"):
        Router([], PAGE, RoundRobin(), lambda rank: 0)


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
        # SGLang's KvMetrics on the wire: a tagged msgpack array.
        push.send(msgspec.msgpack.encode(["KvMetrics", 3, 8, 10, 100, 2, 0.1, 0.5, 0]))
        deadline = time.monotonic() + 5
        while 0 not in kv.reported:
            assert time.monotonic() < deadline
            kv.poll(10)
        assert kv.bad_reports == 1
        assert kv.reported_load(0) == 5  # 3 running + 2 waiting
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
