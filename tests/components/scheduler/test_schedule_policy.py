import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.scheduler.schedule_policy import FCFSPolicy, LPMPolicy, PriorityPolicy
from schedkit.core.component import component_name
from schedkit.core.schedule_batch import Req


def cache_with(*keys):
    allocator = TokenToKVPoolAllocator(size=256)
    cache = RadixCache(allocator=allocator)
    for key in keys:
        cache.insert(key, allocator.alloc(len(key)))
    return cache


def queue():
    # Cached: [1..8] and [50, 51]. Prefix matches: a 0, b 2, c 8, d 4, e 2.
    return [
        Req(rid="a", origin_input_ids=[9, 9, 9]),
        Req(rid="b", origin_input_ids=[50, 51, 52, 53]),
        Req(rid="c", origin_input_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9]),
        Req(rid="d", origin_input_ids=[1, 2, 3, 4, 0]),
        Req(rid="e", origin_input_ids=[50, 51, 60], output_ids=[61]),
    ]


def test_registered_names():
    assert component_name(FCFSPolicy) == "fcfs"
    assert component_name(LPMPolicy) == "lpm"


def test_fcfs_keeps_arrival_order():
    q = queue()
    FCFSPolicy().calc_priority(q)
    assert [r.rid for r in q] == ["a", "b", "c", "d", "e"]


def test_lpm_sorts_by_longest_cached_prefix_stably():
    cache = cache_with([1, 2, 3, 4, 5, 6, 7, 8], [50, 51])
    q = queue()
    LPMPolicy(tree_cache=cache).calc_priority(q)
    assert [r.rid for r in q] == ["c", "d", "b", "e", "a"]
    assert [r.prefix_len for r in q] == [8, 4, 2, 2, 0]


def test_lpm_never_counts_the_last_token_as_cached():
    cache = cache_with([1, 2, 3])
    q = [Req(rid="x", origin_input_ids=[1, 2, 3])]
    LPMPolicy(tree_cache=cache).calc_priority(q)
    assert q[0].prefix_len == 2


def test_lpm_falls_back_to_fcfs_above_the_threshold():
    cache = cache_with([1, 2, 3, 4, 5, 6, 7, 8])
    q = queue()
    LPMPolicy(tree_cache=cache, max_queue_for_prefix_match=4).calc_priority(q)
    assert [r.rid for r in q] == ["a", "b", "c", "d", "e"]
    assert all(r.prefix_len == 0 for r in q)
    LPMPolicy(tree_cache=cache, max_queue_for_prefix_match=5).calc_priority(q)
    assert q[0].rid == "c"


def test_lpm_default_threshold_is_sglangs():
    assert LPMPolicy(tree_cache=cache_with()).max_queue_for_prefix_match == 128
    with pytest.raises(ValueError, match="max_queue_for_prefix_match"):
        LPMPolicy(tree_cache=cache_with(), max_queue_for_prefix_match=-1)


# In-batch prefix caching (SGLang's IN_BATCH_PREFIX_CACHING_* thresholds, 32 and 32).


def prompt(head, n=40, tail=0):
    """``n`` tokens: ``head`` repeated, then ``tail`` distinct tokens."""
    return [head] * n + list(range(1000 + tail, 1000 + tail + 8))


def test_lpm_deprioritizes_requests_sharing_an_uncached_prefix_with_an_earlier_one():
    cache = cache_with([7] * 50)  # cached: 50 sevens
    q = [
        Req(rid="a1", origin_input_ids=prompt(1, tail=0)),
        Req(rid="b1", origin_input_ids=prompt(2, tail=10)),
        Req(rid="a2", origin_input_ids=prompt(1, tail=20)),  # shares 40 tokens with a1
        Req(rid="cached", origin_input_ids=[7] * 60),
        Req(rid="a3", origin_input_ids=prompt(1, tail=30)),
        Req(rid="b2", origin_input_ids=prompt(2, tail=40)),
    ]
    LPMPolicy(tree_cache=cache).calc_priority(q)
    # Longest cached prefix first; then a1 and b1 (queue order); the requests that would
    # recompute a1's or b1's prefix go last, in queue order.
    assert [r.rid for r in q] == ["cached", "a1", "b1", "a2", "a3", "b2"]
    assert [r.prefix_len for r in q] == [50, 0, 0, 0, 0, 0]


def test_lpm_in_batch_match_below_the_threshold_is_not_deprioritized():
    cache = cache_with()
    shared = list(range(100, 131))  # 31 tokens: one short of the threshold
    q = [
        Req(rid="x", origin_input_ids=[*shared, 1, 2, 3]),
        Req(rid="y", origin_input_ids=[*shared, 4, 5, 6]),
        Req(rid="z", origin_input_ids=[*shared, 1, 2, 9]),  # 33 shared with x
    ]
    LPMPolicy(tree_cache=cache).calc_priority(q)
    assert [r.rid for r in q] == ["x", "y", "z"]
    q = [Req(rid="z", origin_input_ids=[*shared, 1, 2, 9]), *q[:2]]
    LPMPolicy(tree_cache=cache).calc_priority(q)
    assert [r.rid for r in q] == ["z", "y", "x"]  # x now follows z: 33 shared tokens


def test_lpm_only_checks_requests_with_a_short_cached_prefix():
    long_prefix = list(range(200, 240))  # 40 tokens cached: above the check threshold
    cache = cache_with(long_prefix)
    q = [
        Req(rid="first", origin_input_ids=[*long_prefix, 1]),
        Req(rid="second", origin_input_ids=[*long_prefix, 2]),
    ]
    LPMPolicy(tree_cache=cache).calc_priority(q)
    assert [r.rid for r in q] == ["first", "second"]
    assert [r.prefix_len for r in q] == [40, 40]
    # With a threshold of 40 cached tokens both are checked and the second is held back.
    q = [
        Req(rid="second", origin_input_ids=[*long_prefix, 2]),
        Req(rid="other", origin_input_ids=[5] * 50),
        Req(rid="first", origin_input_ids=[*long_prefix, 1]),
    ]
    LPMPolicy(tree_cache=cache, in_batch_check_threshold=40).calc_priority(q)
    assert [r.rid for r in q] == ["second", "other", "first"]


def test_lpm_in_batch_thresholds_are_validated():
    with pytest.raises(ValueError, match="in_batch_check_threshold must be an integer >= 0"):
        LPMPolicy(tree_cache=cache_with(), in_batch_check_threshold=-1)
    with pytest.raises(ValueError, match="in_batch_deprioritize_threshold must be an integer"):
        LPMPolicy(tree_cache=cache_with(), in_batch_deprioritize_threshold=0)


def sglang_lpm_order(cache, waiting, check, deprioritize):
    """SGLang's LPM pass, written as SGLang writes it: a temporary radix tree of the waiting
    requests' tokens (here a page-size-1 RadixCache with its own pool). The cache match leaves
    the last token out; the in-batch match takes the whole sequence, as today's SGLang (and
    Dynamo's model of it) do, so identical prompts of exactly the threshold are caught."""
    in_batch_tree = RadixCache(capacity=sum(len(r.fill_ids) for r in waiting) + 1)
    temporary_deprioritized = set()
    prefix = {}
    for r in waiting:
        prefix[r.rid] = cache.match_prefix(r.fill_ids[:-1]).prefix_len
        if prefix[r.rid] <= check:
            if in_batch_tree.match_prefix(r.fill_ids).prefix_len >= deprioritize:
                temporary_deprioritized.add(r.rid)
            else:
                in_batch_tree.insert(r.fill_ids)
    order = sorted(
        waiting,
        key=lambda r: -prefix[r.rid] if r.rid not in temporary_deprioritized else float("inf"),
    )
    return [r.rid for r in order], prefix


@settings(max_examples=60, deadline=None)
@given(
    cached=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8), max_size=4),
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=9), max_size=10),
    check=st.integers(0, 4),
    deprioritize=st.integers(1, 4),
)
def test_lpm_matches_sglangs_pass_with_a_temporary_radix_tree(cached, prompts, check, deprioritize):
    cache = cache_with(*cached)
    waiting = [Req(rid=f"r{i}", origin_input_ids=p) for i, p in enumerate(prompts)]
    expected, prefix = sglang_lpm_order(cache, waiting, check, deprioritize)
    policy = LPMPolicy(
        tree_cache=cache,
        in_batch_check_threshold=check,
        in_batch_deprioritize_threshold=deprioritize,
    )
    policy.calc_priority(waiting)
    assert [r.rid for r in waiting] == expected
    assert {r.rid: r.prefix_len for r in waiting} == prefix


@pytest.mark.parametrize("disabled", ["absent", "disabled"])
def test_lpm_over_no_cache_is_fcfs(disabled):
    cache = None
    if disabled == "disabled":
        cache = RadixCache(allocator=TokenToKVPoolAllocator(size=256), disable=True)
    q = [
        Req(rid="a1", origin_input_ids=prompt(1, tail=0)),
        Req(rid="a2", origin_input_ids=prompt(1, tail=20)),  # would be deprioritized
        Req(rid="b1", origin_input_ids=prompt(2, tail=10)),
    ]
    LPMPolicy(tree_cache=cache).calc_priority(q)
    assert [r.rid for r in q] == ["a1", "a2", "b1"]


def test_priority_policy_orders_by_priority_then_arrival():
    q = [
        Req(rid="low", origin_input_ids=[1], priority=-1),
        Req(rid="none1", origin_input_ids=[1]),
        Req(rid="high1", origin_input_ids=[1], priority=5),
        Req(rid="none2", origin_input_ids=[1]),
        Req(rid="high2", origin_input_ids=[1], priority=5),
    ]
    PriorityPolicy().calc_priority(q)
    assert [r.rid for r in q] == ["high1", "high2", "none1", "none2", "low"]
    PriorityPolicy(low_values_first=True).calc_priority(q)
    assert [r.rid for r in q] == ["low", "none1", "none2", "high1", "high2"]
    assert component_name(PriorityPolicy) == "priority"


def test_equal_priorities_go_by_queue_entry_time_not_queue_position():
    # SGLang sorts by (priority, wait_queue_entry_time): requests [1, 2, 3] of one priority
    # that entered the queue at times 0, 2, 1 come out [1, 3, 2].
    q = [
        Req(rid="1", origin_input_ids=[1], priority=1, wait_queue_entry_time=0.0),
        Req(rid="2", origin_input_ids=[1], priority=1, wait_queue_entry_time=2.0),
        Req(rid="3", origin_input_ids=[1], priority=1, wait_queue_entry_time=1.0),
    ]
    PriorityPolicy().calc_priority(q)
    assert [r.rid for r in q] == ["1", "3", "2"]


def test_identical_prompts_of_exactly_the_threshold_are_deduplicated_in_batch():
    cache = cache_with()
    q = [Req(rid=r, origin_input_ids=list(range(32))) for r in ("first", "twin")]
    q.append(Req(rid="other", origin_input_ids=list(range(1, 33))))
    LPMPolicy(tree_cache=cache).calc_priority(q)
    assert [r.rid for r in q] == ["first", "other", "twin"]


def test_in_batch_dedupe_keeps_namespaces_apart_and_covers_whole_pages():
    allocator = TokenToKVPoolAllocator(size=256, page_size=16)
    cache = RadixCache(allocator=allocator, page_size=16)
    q = [
        Req(rid="a", origin_input_ids=list(range(40))),
        Req(rid="salted", origin_input_ids=list(range(40)), cache_salt="t"),
        Req(rid="b", origin_input_ids=list(range(40))),
        Req(rid="short", origin_input_ids=list(range(31))),  # under 2 pages: never checked
        Req(rid="short2", origin_input_ids=list(range(31))),
    ]
    LPMPolicy(tree_cache=cache).calc_priority(q)
    assert [r.rid for r in q] == ["a", "salted", "short", "short2", "b"]
