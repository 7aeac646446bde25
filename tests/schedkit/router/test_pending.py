"""PendingPrompts and the page counts behind it, against a page-by-page reading of the same
rules, on random prompts and a real KvIndex."""

from __future__ import annotations

import random

import pytest

from schedkit.kv_events import BlockStored, KVEventBatch, KvIndex
from schedkit.router import Router, make_policy
from schedkit.router.base import hold_pages, release_pages
from schedkit.router.pending import PendingPrompts


def leading_pages(hashes, rank, index, pending) -> int:
    """Pages of ``hashes``, from the first, that ``rank`` holds or has on its way."""
    for i, h in enumerate(hashes):
        if not (index.holds(rank, h) or h in pending._pages.get(rank, {})):
            return i
    return len(hashes)


def test_match_and_new_pages_agree_with_a_page_by_page_reading():
    rng = random.Random(7)
    for _ in range(40):
        index, pending = KvIndex(), PendingPrompts(max_pages=rng.choice([3, 8, 256]))
        universe = list(range(1, 25))
        for rank in range(3):
            held = rng.sample(universe, rng.randrange(len(universe)))
            index.apply(KVEventBatch(0.0, [BlockStored(held, None, [], 1, None)]), rank)
        expected_new = dict.fromkeys(range(3), 0)
        for n in range(6):
            rank, hashes = rng.randrange(3), rng.sample(universe, rng.randrange(1, 12))
            counts = pending._pages.get(rank, {})
            expected_new[rank] += sum(
                1
                for h in hashes[: pending.max_pages]
                if not counts.get(h) and not index.holds(rank, h)
            )
            pending.add(f"r{n}", rank, hashes, index)
        prompt = rng.sample(universe, 16)
        assert pending.match(prompt, [2, 0, 1, 5], index) == {
            rank: leading_pages(prompt, rank, index, pending) for rank in (2, 0, 1, 5)
        }
        assert [pending.num_pages(r) for r in range(3)] == [expected_new[r] for r in range(3)]
        for n in range(6):
            pending.discard(f"r{n}")
        assert len(pending) == 0 and not any(pending._pages.values())
        assert [pending.num_pages(r) for r in range(3)] == [0, 0, 0]


def test_a_page_twice_in_a_prompt_counts_twice():
    counts: dict[int, int] = {5: 1}
    hold_pages(counts, [5, 6, 6, 7])
    assert counts == {5: 2, 6: 2, 7: 1}
    release_pages(counts, [6, 6, 5])
    assert counts == {5: 1, 7: 1}
    release_pages(counts, [5, 7, 8])  # a page not held is no error
    assert counts == {}
    hold_pages(counts, [1, 2])
    release_pages(counts, [1])
    assert counts == {2: 1}

    index, pending = KvIndex(), PendingPrompts()
    index.apply(KVEventBatch(0.0, [BlockStored([3], None, [], 1, None)]), 0)
    pending.add("a", 0, [1, 1, 2, 3], index)
    assert pending.num_pages(0) == 2  # 1 and 2: 3 is held, the second 1 already pending
    assert pending._pages[0] == {1: 2, 2: 1, 3: 1}
    pending.discard("a")
    assert pending._pages[0] == {} and pending.num_pages(0) == 0


def test_uncounted_pending_pages_match_alike_and_refuse_a_count():
    rng = random.Random(3)
    index = KvIndex()
    index.apply(KVEventBatch(0.0, [BlockStored(list(range(1, 9)), None, [], 1, None)]), 0)
    counted, uncounted = PendingPrompts(), PendingPrompts(count_new=False)
    for n in range(6):
        rank, hashes = rng.randrange(2), rng.sample(range(1, 25), 10)
        counted.add(f"r{n}", rank, hashes, index)
        uncounted.add(f"r{n}", rank, hashes, index)
    prompt = rng.sample(range(1, 25), 16)
    assert uncounted.match(prompt, [0, 1], index) == counted.match(prompt, [0, 1], index)
    assert uncounted._pages == counted._pages
    with pytest.raises(RuntimeError, match="not counted"):
        uncounted.num_pages(0)
    # The kv policy counts them only for its smallest_cache fallback.
    kv = Router([0, 1], 1, make_policy("kv"))
    smallest = Router([0, 1], 1, make_policy("kv", fallback="smallest_cache"))
    assert not kv.pending.count_new and smallest.pending.count_new
    assert Router([0, 1], 1, make_policy("sglang")).pending.count_new
