"""Exact order statistics of samples larger than a chunk, read a chunk at a time."""

import random
import tracemalloc
from array import array

import pytest

from schedkit.workloads import order_statistics as module
from schedkit.workloads.order_statistics import order_statistics


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(module, "CHUNK", 64)
    monkeypatch.setattr(module, "_PIVOTS", 8)
    monkeypatch.setattr(module, "_GUESS_STRIDE", 2)


MAKERS = [
    lambda rng, n: [rng.random() for _ in range(n)],
    lambda rng, n: [float(rng.randrange(5)) for _ in range(n)],  # few distinct values
    lambda rng, n: [0.25] * n,  # one value
    lambda rng, n: sorted(rng.random() for _ in range(n)),
    lambda rng, n: [rng.expovariate(1.0) * (1e6 if i % 97 else 1) for i in range(n)],
    # the pivots (every 8th value here) all small: one gap holds nearly everything
    lambda rng, n: [rng.random() if i % max(1, n // 8) else -rng.random() for i in range(n)],
]


@pytest.mark.parametrize("make", MAKERS)
def test_equals_sorting_everything(small_chunks, make):
    rng = random.Random(7)
    for n in (1, 63, 64, 65, 1000, 5003):
        values = array("d", make(rng, n))
        ranks = sorted({0, n - 1, n // 2, (n * 9) // 10, (n * 99) // 100, rng.randrange(n)})
        ordered = sorted(values)
        assert order_statistics(values, ranks) == [ordered[r] for r in ranks]
        assert order_statistics(values, ranks[::-1]) == [ordered[r] for r in ranks[::-1]]
        for wanted in ([n // 2, n // 2 + 1], [(n * 9) // 10], [n - 1], ranks):
            wanted = sorted({min(r, n - 1) for r in wanted})
            bracketed = module._bracketed(values, wanted) if n > 64 else None
            # A guess either finds every rank exactly or gives up (then pivots decide).
            assert bracketed is None or bracketed == {r: ordered[r] for r in wanted}
        if n == 5003 and make is not MAKERS[-1]:
            assert module._bracketed(values, [n // 2, (n * 99) // 100]) is not None


def test_out_of_range_ranks_are_refused():
    with pytest.raises(IndexError, match="rank 3 out of range for 3 values"):
        order_statistics([1.0, 2.0, 3.0], [3])


def test_memory_stays_a_small_fraction_of_the_sample(monkeypatch):
    rng = random.Random(1)
    values = array("d", (rng.random() for _ in range(400_000)))  # 25 chunks
    ranks = [200_000, 360_000, 396_000]
    by_pivots = module._by_pivots
    for guessed in (True, False):
        if guessed:  # the guess's brackets hold every rank: no pivots
            monkeypatch.setattr(module, "_by_pivots", None)
        else:  # the pivots' way, on half the sample (13 chunks)
            monkeypatch.setattr(module, "_by_pivots", by_pivots)
            monkeypatch.setattr(module, "_bracketed", lambda *_: None)
            values, ranks = values[:200_000], [100_000, 198_000]
        tracemalloc.start()
        try:
            found = order_statistics(values, ranks)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        sample_bytes = len(values) * values.itemsize
        assert peak < sample_bytes  # sorted() would take about 4x the sample
        if guessed:
            ordered = sorted(values)
            assert found == [ordered[r] for r in ranks]
            del ordered
