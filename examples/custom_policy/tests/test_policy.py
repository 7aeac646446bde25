"""The policy alone: its tree cache is a fake that answers match_prefix as told."""

from pathlib import Path

import pytest
from my_policies import ShortestUncachedFirst

from schedkit.components.cache.radix_cache import MatchResult, RadixCache
from schedkit.core.schedule_batch import Req
from schedkit.testing import fake, isolate

HERE = Path(__file__).resolve().parents[1]
WIRING = HERE.parents[1] / "wiring.yaml"


def _req(rid, prompt_len):
    return Req(rid=rid, origin_input_ids=list(range(prompt_len)))


def _cached(lengths):
    """A match_prefix side effect: the request with ``len(key) + 1`` prompt tokens has
    ``lengths[len(key) + 1]`` tokens cached."""

    def match_prefix(key):
        return MatchResult(device_indices=[0] * lengths.get(len(key) + 1, 0), last_node=None)

    return match_prefix


def test_fewest_tokens_left_to_compute_go_first():
    cache = fake(RadixCache, side_effects={"match_prefix": _cached({900: 880, 300: 0})})
    policy = ShortestUncachedFirst(tree_cache=cache)
    long_cached, mid = _req("a", 900), _req("c", 300)
    queue = [long_cached, mid, _req("b", 40), _req("d", 40)]
    policy.calc_priority(queue)
    # new work: a 20 (880 of 900 cached), b 40, d 40 (after b: ties keep order), c 300
    assert [req.rid for req in queue] == ["a", "b", "d", "c"]
    assert (long_cached.prefix_len, mid.prefix_len) == (880, 0)
    # the last token is never matched: its logits give the next token
    keys = [call.arguments["key"] for call in cache.calls_to("match_prefix")]
    assert [len(key) for key in keys] == [899, 299, 39, 39]


def test_a_long_queue_is_sorted_by_length_without_asking_the_cache():
    cache = fake(RadixCache)
    policy = ShortestUncachedFirst(tree_cache=cache, max_queue_for_prefix_match=2)
    queue = [_req("a", 30), _req("b", 10), _req("c", 20)]
    policy.calc_priority(queue)
    assert [req.rid for req in queue] == ["b", "c", "a"]
    assert cache.calls == []


def test_the_overlay_wires_the_policy_to_the_tree_cache():
    isolated = isolate("policy", WIRING, overlays=[HERE / "policy.yaml"])
    policy, cache = isolated.component, isolated.fakes["tree_cache"]
    assert isinstance(policy, ShortestUncachedFirst) and policy.tree_cache is cache
    cache.side_effects["match_prefix"] = _cached({})
    policy.calc_priority([_req("a", 5)])
    assert len(cache.calls_to("match_prefix")) == 1


def test_a_negative_threshold_is_refused():
    with pytest.raises(ValueError, match="max_queue_for_prefix_match must be >= 0, got -1"):
        ShortestUncachedFirst(tree_cache=fake(RadixCache), max_queue_for_prefix_match=-1)
