"""Observing many samples in a Prometheus histogram at once.

A finished request's inter-token latencies are observed together, one per generated token:
64 calls of ``Histogram.observe`` for a 64-token answer, each taking the histogram's locks and
scanning its buckets, cost a step that finishes 50 such requests ~8 ms of scheduler CPU. Here
the samples are counted into buckets first (``bisect``), then each bucket is increased once
and the sum once: the exposition is the same as observing each sample in turn (a test
compares them). This reads prometheus_client's per-bucket values (``_upper_bounds``,
``_buckets``, ``_sum``, unchanged since 0.4); a histogram without them (another client
version, a stand-in) is observed sample by sample.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

__all__ = ["observe_many"]


def observe_many(histogram: Any, samples: Sequence[float]) -> None:
    """Observe every sample of ``samples`` in ``histogram``, as ``observe`` on each would."""
    if len(samples) < 2:
        for sample in samples:
            histogram.observe(sample)
        return
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for sample in samples:
            histogram.observe(sample)
        return
    counts = [0] * len(bounds)
    last = len(bounds) - 1
    for sample in samples:
        # ``observe`` puts a sample in the first bucket whose bound is >= it (the last bound
        # is +Inf); a NaN it leaves out of every bucket, and so does the second test here.
        index = bisect_left(bounds, sample)
        if index <= last and sample <= bounds[index]:
            counts[index] += 1
    for bucket, count in zip(buckets, counts, strict=True):
        if count:
            bucket.inc(count)
    total.inc(sum(samples))
