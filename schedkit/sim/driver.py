"""Drives an assembled scheduler through a workload and summarises what happened.

Arrivals are submitted when the scheduler's clock (the model runner's ``now()``) reaches their
time; when nothing can run, the clock waits for the next arrival (a virtual clock jumps, a wall
clock sleeps). Latencies are measured on that clock: simulated seconds with ``clock: virtual``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable
from typing import Any

import attrs

from schedkit.components.schedule_batch import FinishAbort, Req
from schedkit.container import Assembly
from schedkit.sim.workload import Workload

__all__ = ["RunSummary", "StuckError", "drive", "percentile"]

# Steps in a row that run nothing while requests are in flight and none is due to arrive.
_MAX_IDLE_STEPS = 1000


class StuckError(RuntimeError):
    """The scheduler stopped making progress with requests still in flight."""


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation; NaN if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@attrs.define(kw_only=True)
class RunSummary:
    """The figures of one run; ``to_dict()`` gives the ``--json`` object."""

    requests_done: int
    requests_failed: int
    output_tokens: int
    request_throughput: float
    output_throughput: float
    request_throughput_wall: float
    output_throughput_wall: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    itl_p50: float
    itl_p90: float
    itl_p99: float
    prefix_cache_hit_rate: float
    kv_events_published: int
    kv_events_dropped: int
    peak_running_requests: int
    retractions: int
    wall_seconds: float
    simulated_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in attrs.asdict(self).items()
        }

    def table(self) -> str:
        """A human-readable summary table."""
        ms = 1e3
        rows = [
            ("requests done / failed", f"{self.requests_done} / {self.requests_failed}"),
            ("output tokens", f"{self.output_tokens}"),
            (
                "request/s (simulated | wall)",
                f"{self.request_throughput:.2f} | {self.request_throughput_wall:.2f}",
            ),
            (
                "token/s (simulated | wall)",
                f"{self.output_throughput:.1f} | {self.output_throughput_wall:.1f}",
            ),
            (
                "TTFT p50 / p90 / p99 (ms)",
                f"{self.ttft_p50 * ms:.1f} / {self.ttft_p90 * ms:.1f} / {self.ttft_p99 * ms:.1f}",
            ),
            (
                "ITL p50 / p90 / p99 (ms)",
                f"{self.itl_p50 * ms:.2f} / {self.itl_p90 * ms:.2f} / {self.itl_p99 * ms:.2f}",
            ),
            ("prefix-cache hit rate", f"{self.prefix_cache_hit_rate:.1%}"),
            (
                "KV event batches published / dropped",
                f"{self.kv_events_published} / {self.kv_events_dropped}",
            ),
            ("peak running requests", f"{self.peak_running_requests}"),
            ("retractions", f"{self.retractions}"),
            ("simulated | wall seconds", f"{self.simulated_seconds:.2f} | {self.wall_seconds:.2f}"),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def _counter(assembly: Assembly, component: str, attribute: str) -> int:
    if component not in assembly:
        return 0
    return int(getattr(assembly[component], attribute, 0) or 0)


def drive(
    assembly: Assembly,
    workload: Workload,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[RunSummary, list[Req]]:
    """Run ``workload`` to completion on ``assembly``; return the summary and the requests.

    ``progress(finished, simulated_seconds)`` is called after steps that finish requests.
    """
    scheduler = assembly["scheduler"]
    runner = assembly["model_runner"]
    order = itertools.count()
    pending = [(a.time, next(order), a.req) for a in workload.initial()]
    heapq.heapify(pending)
    inflight: dict[str, Req] = {}
    finished: list[Req] = []
    start, wall_start = runner.now(), time.perf_counter()
    seen_finished, idle_steps = scheduler.finished_count, 0

    while pending or inflight:
        elapsed = runner.now() - start
        while pending and pending[0][0] <= elapsed:
            arrival, _, req = heapq.heappop(pending)
            req.arrival_time = start + arrival
            inflight[req.rid] = req
            scheduler.submit(req)
        ran = scheduler.step()
        if scheduler.finished_count != seen_finished:
            seen_finished = scheduler.finished_count
            for req in [r for r in inflight.values() if r.finished_output]:
                del inflight[req.rid]
                finished.append(req)
                follow = workload.follow_up(req, runner.now() - start)
                if follow is not None:
                    heapq.heappush(pending, (follow.time, next(order), follow.req))
            if progress is not None:
                progress(len(finished), runner.now() - start)
        if ran:
            idle_steps = 0
        elif pending:
            runner.wait_until(start + pending[0][0])
        else:
            idle_steps += 1
            if idle_steps > _MAX_IDLE_STEPS:
                raise StuckError(
                    f"{len(inflight)} requests in flight but the scheduler ran nothing for "
                    f"{_MAX_IDLE_STEPS} steps (paused: {scheduler.paused})"
                )

    if "kv_events_publisher" in assembly:  # what the cache still holds goes out too
        assembly["kv_events_publisher"].publish_kv_events()
    simulated = runner.now() - start
    wall = time.perf_counter() - wall_start
    done = [r for r in finished if not isinstance(r.finished_reason, FinishAbort)]
    output_tokens = sum(len(r.output_ids) for r in done)
    ttft = [r.first_token_time - r.arrival_time for r in done if r.first_token_time is not None]
    itl = [x for r in done for x in r.itl]
    stats = assembly["metrics_reporter"].stats if "metrics_reporter" in assembly else None
    summary = RunSummary(
        requests_done=len(done),
        requests_failed=len(finished) - len(done),
        output_tokens=output_tokens,
        request_throughput=len(done) / simulated if simulated > 0 else math.nan,
        output_throughput=output_tokens / simulated if simulated > 0 else math.nan,
        request_throughput_wall=len(done) / wall,
        output_throughput_wall=output_tokens / wall,
        ttft_p50=percentile(ttft, 50),
        ttft_p90=percentile(ttft, 90),
        ttft_p99=percentile(ttft, 99),
        itl_p50=percentile(itl, 50),
        itl_p90=percentile(itl, 90),
        itl_p99=percentile(itl, 99),
        prefix_cache_hit_rate=stats.cache_hit_rate if stats is not None else math.nan,
        kv_events_published=_counter(assembly, "kv_events_publisher", "accepted"),
        kv_events_dropped=_counter(assembly, "kv_events_publisher", "dropped"),
        peak_running_requests=scheduler.peak_running_requests,
        retractions=scheduler.num_retracted,
        wall_seconds=wall,
        simulated_seconds=simulated,
    )
    return summary, finished
