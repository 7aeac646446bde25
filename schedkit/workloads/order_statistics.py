"""Exact order statistics of a large sample without sorting it whole.

A run keeps its latency samples in ``array('d')`` (8 bytes each). Sorting one with ``sorted``
builds a list of float objects, four times its size, so a run's summary would take more memory
than the run. ``order_statistics`` reads the sample a chunk at a time instead (``CHUNK`` values
sorted at once): a first pass counts the values at or below each of some evenly spaced sample
values (pivots), which places every wanted rank between two pivots or on one; a second pass
keeps only the values between the pivots around each wanted rank, and the same is done on those
until they fit in a chunk. The result is exact (the values ``sorted(values)[rank]``); the extra
memory is a chunk and the values between the pivots around the wanted ranks.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence

__all__ = ["CHUNK", "order_statistics"]

CHUNK = 1 << 14
_PIVOTS = 1 << 10


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
    return [found[rank] for rank in ranks]


def _sorted_chunks(values: Sequence[float]) -> Iterator[list[float]]:
    for start in range(0, len(values), CHUNK):
        yield sorted(values[start : start + CHUNK])
