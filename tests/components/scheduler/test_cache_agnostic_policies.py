"""lof, random and routing-key, against SGLang's schedule_policy behaviour."""

import pytest

from schedkit.components.scheduler.cache_agnostic_policies import (
    LongestOutputFirstPolicy,
    RandomPolicy,
    RoutingKeyPolicy,
)
from schedkit.core.component import component_name
from schedkit.core.schedule_batch import ForwardMode, Req, SamplingParams, ScheduleBatch


def req(rid, max_new_tokens=16, priority=None, routing_key=None):
    return Req(
        rid=rid,
        origin_input_ids=[1, 2],
        sampling_params=SamplingParams(max_new_tokens=max_new_tokens),
        priority=priority,
        routing_key=routing_key,
    )


def rids(q):
    return [r.rid for r in q]


def test_names_are_sglangs():
    assert component_name(LongestOutputFirstPolicy) == "lof"
    assert component_name(RandomPolicy) == "random"
    assert component_name(RoutingKeyPolicy) == "routing-key"


def test_lof_puts_the_longest_output_first_and_keeps_queue_order_among_equals():
    q = [req("a", 1), req("b", 1000), req("c", 100), req("d", 1000)]
    LongestOutputFirstPolicy().calc_priority(q)
    assert rids(q) == ["b", "d", "c", "a"]


@pytest.mark.parametrize(
    ("low_values_first", "order"),
    [(False, ["p5-10", "p5-1", "p0-100"]), (True, ["p0-100", "p5-10", "p5-1"])],
)
def test_lof_with_priority_scheduling_sorts_by_priority_first(low_values_first, order):
    q = [req("p5-1", 1, 5), req("p0-100", 100, 0), req("p5-10", 10, 5)]
    policy = LongestOutputFirstPolicy(
        enable_priority_scheduling=True, low_values_first=low_values_first
    )
    policy.calc_priority(q)
    assert rids(q) == order


def test_random_shuffles_reproducibly_by_seed_and_keeps_every_request():
    def order(seed):
        q = [req(str(i)) for i in range(20)]
        RandomPolicy(seed=seed).calc_priority(q)
        return rids(q)

    assert order(3) == order(3)
    assert order(3) != [str(i) for i in range(20)]
    assert sorted(order(4), key=int) == [str(i) for i in range(20)]


def running(*keys):
    reqs = [req(f"run{i}", routing_key=k) for i, k in enumerate(keys)]
    return ScheduleBatch(reqs=reqs, forward_mode=ForwardMode.DECODE)


def test_routing_key_groups_by_running_frequency_then_key():
    batch = running("b", "a", "a", None, "c")
    q = [
        req("x"),
        req("z1", routing_key="z"),
        req("c1", routing_key="c"),
        req("a1", routing_key="a"),
        req("y1", routing_key="y"),
        req("b1", routing_key="b"),
    ]
    RoutingKeyPolicy(running_batch=lambda: batch).calc_priority(q)
    # a runs twice; b and c once each (then by key); the rest after, by key, none first.
    assert rids(q) == ["a1", "b1", "c1", "x", "y1", "z1"]


@pytest.mark.parametrize("batch", [None, running(None, None)])
def test_routing_key_leaves_the_queue_without_running_keys(batch):
    q = [req("z1", routing_key="z"), req("a1", routing_key="a")]
    RoutingKeyPolicy(running_batch=lambda: batch).calc_priority(q)
    assert rids(q) == ["z1", "a1"]
