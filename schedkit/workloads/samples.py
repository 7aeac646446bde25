"""What a run keeps of its finished requests and of its queues: a few numbers per request
(latencies) and a timeline of running and queued requests whose size is bounded."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

import attrs

from schedkit.core.schedule_batch import FinishAbort, Req
from schedkit.workloads.order_statistics import order_statistics

__all__ = ["PERCENTILES", "Tally", "Timeline", "cdf_points", "percentiles"]

PERCENTILES = (50, 90, 99)


def percentiles(values: Sequence[float], qs: Sequence[float] = PERCENTILES) -> list[float]:
    """The ``qs``-th percentiles (0-100) of ``values`` by linear interpolation (exact; read in
    sorted chunks, see ``order_statistics``); NaN for each when ``values`` is empty."""
    if not len(values):
        return [math.nan] * len(qs)
    last = len(values) - 1
    spots = []
    for q in qs:
        pos = last * q / 100
        low = int(pos)
        spots.append((low, min(low + 1, last), pos - low))
    ranks = sorted({rank for low, high, _ in spots for rank in (low, high)})
    at = dict(zip(ranks, order_statistics(values, ranks), strict=True))
    return [at[low] + (at[high] - at[low]) * frac for low, high, frac in spots]


def cdf_points(values: Sequence[float], max_points: int = 1000) -> tuple[list[float], list[float]]:
    """The empirical CDF of ``values`` as (sorted values, fraction at or below each), thinned
    to at most ``max_points`` points evenly spread over the ranks (the last one always kept)."""
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, got {max_points}")
    n = len(values)
    if n == 0:
        return [], []
    step = max(1, math.ceil(n / max_points))
    ranks = list(range(step - 1, n, step))
    if ranks[-1] != n - 1:
        ranks.append(n - 1)
    return order_statistics(values, ranks), [(i + 1) / n for i in ranks]


@attrs.define
class Timeline:
    """Running and queued requests over simulated time, one sample every ``stride`` steps.

    At most ``capacity`` samples are kept: when full, every other one is dropped and the
    stride doubles, so memory stays flat however long the run and the samples stay evenly
    spaced in steps.
    """

    capacity: int = 4096
    stride: int = 1
    seconds: array = attrs.Factory(lambda: array("d"))
    running: array = attrs.Factory(lambda: array("l"))
    queued: array = attrs.Factory(lambda: array("l"))
    _steps: int = 0

    def __attrs_post_init__(self) -> None:
        if self.capacity < 2 or self.capacity % 2:
            raise ValueError(f"capacity must be an even number >= 2, got {self.capacity}")

    def add(self, seconds: float, running: int, queued: int) -> None:
        """Record one step (kept if it falls on the stride)."""
        steps = self._steps
        self._steps = steps + 1
        if steps % self.stride:
            return
        self.seconds.append(seconds)
        self.running.append(running)
        self.queued.append(queued)
        if len(self.seconds) >= self.capacity:
            self.seconds = self.seconds[::2]
            self.running = self.running[::2]
            self.queued = self.queued[::2]
            self.stride *= 2

    def add_run(self, seconds: Sequence[float], running: int, queued: int) -> None:
        """Record steps ending at ``seconds`` with the same running and queued requests, as
        as many ``add`` calls would."""
        steps, total = self._steps, len(seconds)
        end = steps + total
        first = -steps % self.stride  # the index of the first step on the stride
        while first < total:
            room = self.capacity - len(self.seconds)  # samples until the next halving
            stride = self.stride
            last = min(total, first + room * stride)
            kept = seconds[first:last:stride]
            self.seconds.extend(kept)
            self.running.extend([running] * len(kept))
            self.queued.extend([queued] * len(kept))
            if len(self.seconds) >= self.capacity:
                self.seconds = self.seconds[::2]
                self.running = self.running[::2]
                self.queued = self.queued[::2]
                self.stride *= 2
            first = first + len(kept) * stride
            first += -(steps + first) % self.stride
        self._steps = end


@attrs.define
class Tally:
    """What a summary needs of the finished requests, a few numbers each (seconds on the
    assembly's clock), and the queue ``timeline``.

    ``ttft``, ``e2e`` (arrival to finish) and ``queue_time`` (arrival to first admission) hold
    one value per completed request; ``tpot`` one per completed request of more than one
    token (decode time per output token after the first); ``itl`` every inter-token latency.
    Refused or aborted requests are only counted in ``failed``.
    """

    done: int = 0
    failed: int = 0
    output_tokens: int = 0
    ttft: array = attrs.Factory(lambda: array("d"))
    itl: array = attrs.Factory(lambda: array("d"))
    e2e: array = attrs.Factory(lambda: array("d"))
    queue_time: array = attrs.Factory(lambda: array("d"))
    tpot: array = attrs.Factory(lambda: array("d"))
    timeline: Timeline = attrs.Factory(Timeline)

    def add(self, req: Req) -> None:
        """Keep what the summary needs of a finished request."""
        if isinstance(req.finished_reason, FinishAbort):
            self.failed += 1
            return
        self.done += 1
        generated = len(req.output_ids)
        self.output_tokens += generated
        arrival, first, finish = req.arrival_time, req.first_token_time, req.finish_time
        if first is not None:
            self.ttft.append(first - arrival)
        if finish is not None:
            self.e2e.append(finish - arrival)
            if first is not None and generated > 1:
                self.tpot.append((finish - first) / (generated - 1))
        if req.scheduled_time is not None:
            self.queue_time.append(req.scheduled_time - arrival)
        self.itl.extend(req.itl)
