"""Exact order statistics of a large sample without sorting it whole.

A run keeps its latency samples in ``array('d')`` (8 bytes each). Sorting one with ``sorted``
builds a list of float objects, four times its size, so a run's summary would take more memory
than the run. ``order_statistics`` reads the sample a chunk at a time instead (``CHUNK`` values
sorted at once). First it guesses where each wanted rank lies from every 64th value, sorted: a
bracket of values around the guess, wide enough to hold the rank unless the sample is far from
evenly spread. One pass then counts the values below each bracket and keeps those inside it,
which gives each rank whose bracket holds it. Otherwise (or when a bracket holds too much), a
pass counts the values at or below each of some evenly spaced sample values (pivots), which
places every wanted rank between two pivots or on one; a second pass keeps only the values
between the pivots around each wanted rank, and the same is done on those until they fit in a
chunk; so too for more than a few ranks at once. The result is exact (the values
``sorted(values)[rank]``); the extra memory is a chunk, every 64th value as floats (a sixteenth
of the sample's bytes), and the values inside the brackets or between the pivots around the ranks.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence

__all__ = ["CHUNK", "order_statistics"]

CHUNK = 1 << 14
_PIVOTS = 1 << 10
_GUESS_STRIDE = 64  # the guess reads every 64th value
_SPREAD = 5.0  # a bracket spans the guess +- 5 standard deviations of a random sample's
_MAX_GUESSED = 8  # more ranks at once (a CDF's): pivots straight away


def order_statistics(values: Sequence[float], ranks: Sequence[int]) -> list[float]:
    """``sorted(values)[r]`` for each ``r`` in ``ranks`` (0 <= r < len(values)), reading
    ``values`` in sorted chunks of at most ``CHUNK``; values must not be NaN."""
    n = len(values)
    for rank in ranks:
        if not 0 <= rank < n:
            raise IndexError(f"rank {rank} out of range for {n} values")
    if n <= CHUNK:
        ordered = sorted(values)
        return [ordered[rank] for rank in ranks]
    wanted = sorted(set(ranks))
    found = _bracketed(values, wanted) if len(wanted) <= _MAX_GUESSED else None
    if found is None:
        found = _by_pivots(values, ranks)
    return [found[rank] for rank in ranks]


def _by_pivots(values: Sequence[float], ranks: Sequence[int]) -> dict[int, float]:
    """Rank -> value by evenly spaced pivots (see the module docstring)."""
    n = len(values)
    pivots = sorted(set(values[:: max(1, n // _PIVOTS)]))
    at_or_below = [0] * len(pivots)  # values <= pivots[j]
    below = [0] * len(pivots)  # values < pivots[j]
    for chunk in _sorted_chunks(values):
        for j, pivot in enumerate(pivots):
            at_or_below[j] += bisect_right(chunk, pivot)
            below[j] += bisect_left(chunk, pivot)
    found: dict[int, float] = {}
    gaps: dict[int, list[int]] = {}  # j -> ranks strictly between pivots[j - 1] and pivots[j]
    for rank in set(ranks):
        j = bisect_right(at_or_below, rank)  # the first pivot with more values at or below
        if j < len(pivots) and below[j] <= rank:
            found[rank] = pivots[j]
        else:
            gaps.setdefault(j, []).append(rank)
    if gaps:
        inside = {j: array("d") for j in gaps}
        for chunk in _sorted_chunks(values):
            for j, kept in inside.items():
                start = bisect_right(chunk, pivots[j - 1]) if j > 0 else 0
                stop = bisect_left(chunk, pivots[j]) if j < len(pivots) else len(chunk)
                kept.extend(chunk[start:stop])
        for j, gap_ranks in gaps.items():
            offset = at_or_below[j - 1] if j > 0 else 0
            within = order_statistics(inside.pop(j), [rank - offset for rank in gap_ranks])
            found.update(zip(gap_ranks, within, strict=True))
    return found


def _bracketed(values: Sequence[float], ranks: list[int]) -> dict[int, float] | None:
    """Rank -> value for ``ranks`` (sorted, distinct) from brackets around guesses (see the
    module docstring); None when a bracket missed its rank or held too many values."""
    n = len(values)
    guess = sorted(values[::_GUESS_STRIDE])
    m = len(guess)
    brackets: list[list] = []  # [low, high, ranks]; None: unbounded on that side
    for rank in ranks:
        p = rank / n
        spread = _SPREAD * math.sqrt(p * (1 - p) * m) + 2
        low_at, high_at = math.floor(p * m - spread), math.ceil(p * m + spread)
        low = guess[low_at] if low_at >= 0 else None
        high = guess[high_at] if high_at < m else None
        last = brackets[-1] if brackets else None
        if last is not None and (last[1] is None or low is None or low <= last[1]):
            last[1] = None if last[1] is None or high is None else max(last[1], high)
            last[2].append(rank)
        else:
            brackets.append([low, high, [rank]])
    del guess
    counts = [[0, 0, 0] for _ in brackets]  # below low, equal to low, equal to high
    inside = [array("d") for _ in brackets]  # strictly between low and high
    most = max(CHUNK, n // 8)
    for chunk in _sorted_chunks(values):
        for (low, high, _), count, kept in zip(brackets, counts, inside, strict=True):
            start = stop = 0 if low is None else bisect_left(chunk, low)
            if low is not None:
                stop = bisect_right(chunk, low, start)
            count[0] += start
            count[1] += stop - start
            if high is None:
                kept.extend(chunk[stop:])
            elif high != low:
                end = bisect_left(chunk, high, stop)
                kept.extend(chunk[stop:end])
                count[2] += bisect_right(chunk, high, end) - end
            if len(kept) > most:
                return None
    found: dict[int, float] = {}
    for (low, high, bracket_ranks), (below, at_low, at_high), kept in zip(
        brackets, counts, inside, strict=True
    ):
        ordered: list[float] | None = None
        for rank in bracket_ranks:
            k = rank - below
            if k < 0:
                return None
            if k < at_low:
                found[rank] = low
                continue
            k -= at_low
            if k < len(kept):
                if ordered is None:
                    ordered = sorted(kept)
                found[rank] = ordered[k]
                continue
            k -= len(kept)
            if k >= at_high:
                return None
            found[rank] = high
    return found


def _sorted_chunks(values: Sequence[float]) -> Iterator[list[float]]:
    for start in range(0, len(values), CHUNK):
        yield sorted(values[start : start + CHUNK])
