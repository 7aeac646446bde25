"""Each routing policy's decision on hand-made candidates, against its source's rule."""

from __future__ import annotations

import pytest

from schedkit.router import (
    POLICIES,
    SIGNALS,
    DynamoKvCost,
    KvCacheAware,
    LeastLoaded,
    LlmdScorers,
    LongestPrefix,
    PowerOfTwo,
    RoundRobin,
    SessionAffinity,
    SglangCacheAware,
    make_policy,
    policy_settings,
)
from schedkit.router.dynamo import softmax_sample
from tests.schedkit.router.helpers import PAGE, board, candidates


def test_cache_aware_routes_to_the_least_loaded_when_imbalanced():
    policy = KvCacheAware(balance_abs_threshold=4, balance_rel_threshold=1.5)
    # max - min = 5 > 4 and 10 > 5 * 1.5: imbalanced, whatever the prefix says.
    assert policy.choose(candidates({0: 4, 1: 0, 2: 0}, {0: 10, 1: 5, 2: 6})) == (1, "imbalanced")
    # Both comparisons are strict: a spread of exactly 4, or max == min * rel, is balanced.
    assert policy.choose(candidates({0: 4, 1: 0}, {0: 8, 1: 4}))[1] == "prefix"
    assert policy.choose(candidates({0: 4, 1: 0}, {0: 15, 1: 10}))[1] == "prefix"
    # Equal least loads: the first in rank order, as Rust's min_by_key.
    assert policy.choose(candidates({}, {0: 20, 1: 2, 2: 2})) == (1, "imbalanced")
    # Rank 1 was sent more requests so far than rank 2: the gateway's rule (sglang's
    # default) still takes the first; ``fewest_routed`` (kv's default) takes rank 2.
    loads = board({0: 20, 1: 2, 2: 2})
    loads[1].routed, loads[2].routed = 9, 3
    assert SglangCacheAware(balance_abs_threshold=4).tie_break == "first"
    assert KvCacheAware(tie_break="first").choose(candidates({}, loads))[0] == 1
    assert KvCacheAware(balance_abs_threshold=4).choose(candidates({}, loads))[0] == 2
    # The same on the fallback below the cache threshold (balanced loads).
    even = board({0: 2, 1: 1, 2: 1})
    even[1].routed, even[2].routed = 9, 3
    first = KvCacheAware(fallback="least_loaded", tie_break="first")
    assert first.choose(candidates({}, even)) == (1, "least_loaded")
    assert KvCacheAware(fallback="least_loaded").choose(candidates({}, even)) == (2, "least_loaded")


def test_cache_aware_prefix_above_the_threshold_else_the_fallback():
    policy = KvCacheAware(cache_threshold=0.5, fallback="least_loaded")
    # 3 pages of 4 tokens out of 16 prompt tokens: rate 0.75 > 0.5.
    assert policy.choose(candidates({0: 1, 1: 3}, {0: 0, 1: 3})) == (1, "prefix")
    # Exactly 0.5 is not above the threshold: the least loaded (today's gateway) ...
    assert policy.choose(candidates({0: 2, 1: 0}, {0: 1, 1: 0}, {0: 9, 1: 5})) == (
        1,
        "least_loaded",
    )
    # ... or the rank whose cache holds the fewest pages (the gateway's earlier rule).
    older = KvCacheAware(cache_threshold=0.5, fallback="smallest_cache")
    assert older.choose(candidates({0: 2, 1: 0}, {0: 0, 1: 1}, {0: 9, 1: 5})) == (
        1,
        "smallest_cache",
    )
    assert older.choose(candidates({0: 0, 1: 0}, {0: 2, 1: 1}, {0: 3, 1: 3}))[0] == 1
    # Equal best matches: the less loaded of them.
    assert policy.choose(candidates({0: 3, 1: 3, 2: 0}, {0: 2, 1: 1, 2: 0}))[0] == 1


def test_a_miss_goes_by_prefill_queued_or_by_load():
    # 0 has one request with a 32k-token prompt queued; 1 has three short ones.
    loads = board(requests={0: 1, 1: 3}, tokens={0: 32_000, 1: 300})
    assert KvCacheAware().choose(candidates({}, loads)) == (1, "least_prefill")
    assert SglangCacheAware().fallback == "least_loaded"  # the gateway: fewest requests
    assert KvCacheAware(fallback="least_loaded").choose(candidates({}, loads))[0] == 0
    by_tokens = KvCacheAware(fallback="least_loaded", load="tokens")
    assert by_tokens.choose(candidates({}, loads))[0] == 1


def test_cache_aware_defaults_are_the_gateway_command_line_defaults():
    for cls in (KvCacheAware, SglangCacheAware):
        p = cls()
        assert (p.cache_threshold, p.balance_abs_threshold, p.balance_rel_threshold) == (
            0.3,
            64,
            1.5,
        )
    p = SglangCacheAware()
    assert (p.eviction_interval, p.max_tree_size) == (60.0, 67_108_864)


def test_sglang_inserts_what_it_routes_and_follows_it():
    policy = SglangCacheAware()
    loads = board({0: 0, 1: 0})
    first = candidates({}, loads)
    assert policy.choose(first) == (0, "least_loaded")
    loads[0].requests = 1  # the first is in flight on 0
    # The same prompt: its own tree says 0 holds all of it.
    assert policy.choose(candidates({}, loads)) == (0, "prefix")
    # A different prompt: no match, so the least loaded.
    other = candidates({}, loads, prompt_tokens=12)
    other.token_ids = list(range(5000, 5012))
    assert policy.choose(other) == (1, "least_loaded")


def test_sglang_evicts_its_tree_on_its_interval():
    policy = SglangCacheAware(eviction_interval=10, max_tree_size=0)
    loads = board({0: 0, 1: 0})
    assert policy.choose(candidates({}, loads, now=0.0))[0] == 0
    loads[0].requests = 1
    assert policy.choose(candidates({}, loads, now=5.0)) == (0, "prefix")
    # At 10 s the tree is cut to 0 tokens: the prompt matches nothing any more.
    assert policy.choose(candidates({}, loads, now=10.0)) == (1, "least_loaded")


def test_dynamo_cost_is_overlap_weighted_prefill_blocks_plus_active_blocks():
    policy = DynamoKvCost()
    loads = board(requests={0: 0, 1: 0}, tokens={0: 40, 1: 0})
    c = candidates({0: 4, 1: 0}, loads)  # 16-token prompt, 4 pages cached on 0
    # rank 0: (40 + 16 - 16) / 4 = 10 prefill blocks + 0 active + 4 new = 14
    # rank 1: (0 + 16) / 4 = 4 prefill blocks + 0 + 4 new = 8: rank 1
    assert policy.choose(c) == (1, "cost")
    policy.on_routed(c, 1, "r1")
    # Now rank 1 has the 4 pages active (no new ones for the same prompt): 4 + 4 + 0 = 8 vs
    # rank 0's 14: still 1. A weight of 0 leaves active blocks alone: 8 + 0 vs 4 + 4 - tie.
    assert policy.choose(candidates({0: 4, 1: 0}, loads))[0] == 1
    policy.on_finished("r1")
    assert policy._active[1] == {}
    # Equal lowest logits: uniformly at random whatever the trees' sizes, as Dynamo 1.6.1's
    # minimum_cost_index (its older selector sent them to the smallest tree).
    tied = board({0: 0, 1: 0, 2: 0})
    c = candidates({0: 2, 1: 2, 2: 2}, tied, cached={0: 50, 1: 10, 2: 30})
    picks = [DynamoKvCost(seed=s).choose(c)[0] for s in range(60)]
    assert {picks.count(r) for r in (0, 1, 2)} <= set(range(10, 31)), picks
    # The overlap credit scales the matched pages off the prefill blocks (clamped at 0), and
    # each active request can weigh on its own: rank 0 (4 pages matched) at credit 0.5 costs
    # (16 / 4 - 2) + 4 = 6 against rank 1's 4 + 4 = 8; one request active on rank 0 at weight
    # 3 makes it 9.
    c = candidates({0: 4, 1: 0}, board({0: 1, 1: 0}))
    assert DynamoKvCost(overlap_score_credit=0.5).choose(c)[0] == 0
    both = DynamoKvCost(overlap_score_credit=0.5, decode_active_request_weight=3.0)
    assert both.choose(c)[0] == 1


def test_dynamo_softmax_sampling():
    import random

    rng = random.Random(0)
    assert softmax_sample({0: 0.2, 1: 0.5}, 0.0, rng) == 0
    assert {softmax_sample({0: 1.0, 1: 1.0}, 0.0, rng) for _ in range(50)} == {0, 1}
    draws = [softmax_sample({0: 0.0, 1: 1.0}, 1.0, rng) for _ in range(4000)]
    # exp(-0) : exp(-1) -> 0.731 for the lower logit
    assert draws.count(0) / len(draws) == pytest.approx(0.731, abs=0.03)


def test_llm_d_weighs_prefix_queue_and_kv_usage():
    policy = LlmdScorers()
    loads = board(queued={0: 4, 1: 0, 2: 2}, kv_usage={0: 0.5, 1: 0.9, 2: 0.0})
    # prefix: 0 -> 1.0 (only holder); queue: 0 -> 0, 1 -> 1, 2 -> 0.5; kv: .5, .1, 1
    # 0: 3 + 0 + 1.0 = 4.0; 1: 0 + 2 + 0.2 = 2.2; 2: 0 + 1 + 2 = 3.0
    assert policy.choose(candidates({0: 3, 1: 0, 2: 0}, loads)) == (0, "score")
    # Two holders of different lengths are min-max normalised: 2 -> 1.0, 0 -> 0.0.
    assert policy.choose(candidates({0: 1, 1: 0, 2: 3}, loads))[0] == 2


def test_power_of_two_takes_the_less_loaded_of_two_by_tokens():
    loads = board(requests={0: 0, 1: 0, 2: 0}, tokens={0: 100, 1: 5, 2: 50})
    policy = PowerOfTwo(seed=1)
    picks = [policy.choose(candidates({}, loads))[0] for _ in range(200)]
    assert 0 not in picks  # it always loses its pair
    assert set(picks) == {1, 2}


def test_session_affinity_sticks_a_conversation_to_its_worker():
    policy = SessionAffinity(max_sessions=2)
    loads = board(requests={0: 0, 1: 0}, tokens={0: 10, 1: 0})
    assert policy.choose(candidates({}, loads, session="a")) == (1, "new_session")
    loads[1].prefill_tokens = 100
    assert policy.choose(candidates({}, loads, session="a")) == (1, "session")
    assert policy.choose(candidates({}, loads, session="b")) == (0, "new_session")
    assert policy.choose(candidates({}, loads, session="c"))[1] == "new_session"
    # three sessions, room for two: "a" (least recently seen) is forgotten
    assert policy.choose(candidates({}, loads, session="a")) == (0, "new_session")
    assert policy.choose(candidates({}, loads)) == (0, "no_session")


def test_round_robin_least_loaded_and_longest_prefix():
    policy = RoundRobin()
    picks = [policy.choose(candidates({}, {0: 9, 1: 0, 2: 0}))[0] for _ in range(4)]
    assert picks == [0, 1, 2, 0]
    assert LeastLoaded().choose(candidates({}, {0: 3, 1: 1, 2: 1})) == (1, "least_loaded")
    policy = LongestPrefix()
    assert policy.choose(candidates({0: 2, 1: 1}, {0: 5, 1: 0})) == (0, "prefix")
    assert policy.choose(candidates({0: 0, 1: 0}, {0: 0, 1: 0})) == (1, "tie")  # 0 went last
    assert policy.choose(candidates({0: 0, 1: 0}, {0: 0, 1: 0})) == (0, "tie")


def test_every_policy_is_registered_states_its_signals_and_builds_from_its_settings():
    assert set(POLICIES) >= {
        "sglang",
        "kv",
        "dynamo",
        "llm-d",
        "power_of_two",
        "session",
        "round_robin",
        "least_loaded",
        "longest_prefix",
    }
    for name, cls in POLICIES.items():
        assert set(cls.signals) <= set(SIGNALS), name
        assert type(make_policy(name, **policy_settings(name))) is cls


def test_make_policy_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown routing policy 'kvv'; valid: dynamo, kv"):
        make_policy("kvv")
    library = make_policy(
        "kv", cache_threshold=0.5, balance_abs_threshold=32, balance_rel_threshold=1.1
    )
    assert (library.cache_threshold, library.balance_abs_threshold) == (0.5, 32)
    with pytest.raises(ValueError, match="'round_robin' takes no 'cache_threshold'; it takes no"):
        make_policy("round_robin", cache_threshold=0.5)
    with pytest.raises(ValueError, match="'cache_threshold' must be <= 1"):
        make_policy("kv", cache_threshold=1.5)
    with pytest.raises(ValueError, match="fallback must be one of least_loaded, least_prefill"):
        make_policy("sglang", fallback="random")


def test_a_policy_of_ones_own_by_module_and_class():
    policy = make_policy("schedkit.router.simple:RoundRobin")
    assert isinstance(policy, RoundRobin)
    with pytest.raises(ValueError, match="cannot import it"):
        make_policy("no_such_module_here:Policy")
    assert PAGE == 4
