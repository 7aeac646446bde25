"""Drives an assembled scheduler through a workload and summarises what happened.

Arrivals are submitted when the scheduler's clock (the model runner's ``now()``) reaches their
time; when nothing can run, the clock waits for the next arrival (a virtual clock jumps, a wall
clock sleeps). Latencies are measured on that clock: simulated seconds with ``clock: virtual``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import resource
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from schedkit.components.schedule_batch import FinishAbort, Req
from schedkit.container import Assembly
from schedkit.sim.workload import Workload

__all__ = [
    "RunSummary",
    "Stepper",
    "StuckError",
    "Tally",
    "drive",
    "percentile",
    "summarize",
]

# Steps in a row that run nothing while requests are in flight.
_MAX_IDLE_STEPS = 1000


class StuckError(RuntimeError):
    """The scheduler stopped making progress with requests still in flight."""


def percentile(values: Sequence[float], q: float) -> float:
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
    peak_rss_mb: float
    interrupted: bool = False

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
            ("peak memory (RSS, MiB)", f"{self.peak_rss_mb:.0f}"),
        ]
        if self.interrupted:
            rows.insert(0, ("interrupted", "yes: figures cover the requests finished so far"))
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def _counter(assembly: Assembly, component: str, attribute: str) -> int:
    if component not in assembly:
        return 0
    return int(getattr(assembly[component], attribute, 0) or 0)


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20


@attrs.define
class Tally:
    """What a summary needs of the finished requests, a few numbers each (seconds on the
    assembly's clock): TTFT, inter-token latencies, TPOT (decode time per output token after
    the first) and end-to-end latency of each request that did not fail."""

    done: int = 0
    failed: int = 0
    output_tokens: int = 0
    ttft: array = attrs.Factory(lambda: array("d"))
    itl: array = attrs.Factory(lambda: array("d"))
    tpot: array = attrs.Factory(lambda: array("d"))
    e2e: array = attrs.Factory(lambda: array("d"))

    def add(self, req: Req) -> None:
        """Count a finished request."""
        if isinstance(req.finished_reason, FinishAbort):
            self.failed += 1
            return
        self.done += 1
        outputs = len(req.output_ids)
        self.output_tokens += outputs
        first, finish = req.first_token_time, req.finish_time
        if first is not None:
            self.ttft.append(first - req.arrival_time)
            if finish is not None and outputs > 1:
                self.tpot.append((finish - first) / (outputs - 1))
        if finish is not None:
            self.e2e.append(finish - req.arrival_time)
        self.itl.extend(req.itl)


class Stepper:
    """One assembly's side of a run: requests submitted at their arrival time on the
    assembly's clock (seconds from ``start``), the scheduler stepped, and the requests that
    finish handed back (their numbers go to ``tally``; ``on_finish(req)`` sees each first)."""

    def __init__(self, assembly: Assembly, on_finish: Callable[[Req], None] | None = None) -> None:
        self.assembly = assembly
        self.scheduler = assembly["scheduler"]
        self.runner = assembly["model_runner"]
        self.on_finish = on_finish
        self.start = self.runner.now()
        self.inflight: dict[str, Req] = {}
        self.tally = Tally()
        self.idle_steps = 0
        self._seen_finished = self.scheduler.finished_count

    def elapsed(self) -> float:
        """Seconds since the start on the assembly's clock."""
        return self.runner.now() - self.start

    def submit(self, at: float, req: Req) -> None:
        """Hand ``req``, arriving ``at`` seconds from the start, to the scheduler."""
        req.arrival_time = self.start + at
        self.inflight[req.rid] = req
        self.scheduler.submit(req)

    def wait_until(self, at: float) -> None:
        """Let the clock reach ``at`` seconds from the start with nothing running."""
        self.runner.wait_until(self.start + at)

    def step(self) -> tuple[bool, list[Req]]:
        """One scheduler step: whether a batch ran, and the requests that finished.

        StuckError when requests are in flight and nothing ran for ``_MAX_IDLE_STEPS`` steps
        in a row."""
        scheduler = self.scheduler
        ran = scheduler.step()
        finished: list[Req] = []
        if scheduler.finished_count != self._seen_finished:
            self._seen_finished = scheduler.finished_count
            finished = [r for r in self.inflight.values() if r.finished_output]
            for req in finished:
                del self.inflight[req.rid]
                self.tally.add(req)
                if self.on_finish is not None:
                    self.on_finish(req)
        if ran or not self.inflight:
            self.idle_steps = 0
        else:
            self.idle_steps += 1
            if self.idle_steps > _MAX_IDLE_STEPS:
                raise StuckError(
                    f"{len(self.inflight)} requests in flight but the scheduler ran nothing "
                    f"for {_MAX_IDLE_STEPS} steps (paused: {scheduler.paused})"
                )
        return ran, finished

    def summary(self, wall: float, interrupted: bool = False) -> RunSummary:
        """The run's figures so far (``wall``: the wall seconds it took)."""
        return summarize(self.assembly, self.tally, self.elapsed(), wall, interrupted)


def summarize(
    assembly: Assembly, tally: Tally, simulated: float, wall: float, interrupted: bool = False
) -> RunSummary:
    """The ``RunSummary`` of ``tally`` on ``assembly`` (its cache, KV-event and batch figures)."""
    scheduler = assembly["scheduler"]
    stats = assembly["metrics_reporter"].stats if "metrics_reporter" in assembly else None
    return RunSummary(
        requests_done=tally.done,
        requests_failed=tally.failed,
        output_tokens=tally.output_tokens,
        request_throughput=tally.done / simulated if simulated > 0 else math.nan,
        output_throughput=tally.output_tokens / simulated if simulated > 0 else math.nan,
        request_throughput_wall=tally.done / wall if wall > 0 else math.nan,
        output_throughput_wall=tally.output_tokens / wall if wall > 0 else math.nan,
        ttft_p50=percentile(tally.ttft, 50),
        ttft_p90=percentile(tally.ttft, 90),
        ttft_p99=percentile(tally.ttft, 99),
        itl_p50=percentile(tally.itl, 50),
        itl_p90=percentile(tally.itl, 90),
        itl_p99=percentile(tally.itl, 99),
        prefix_cache_hit_rate=stats.cache_hit_rate if stats is not None else math.nan,
        kv_events_published=_counter(assembly, "kv_events_publisher", "accepted"),
        kv_events_dropped=_counter(assembly, "kv_events_publisher", "dropped"),
        peak_running_requests=scheduler.peak_running_requests,
        retractions=scheduler.num_retracted,
        wall_seconds=wall,
        simulated_seconds=simulated,
        peak_rss_mb=peak_rss_mb(),
        interrupted=interrupted,
    )


def drive(
    assembly: Assembly,
    workload: Workload,
    progress: Callable[[int, float], None] | None = None,
    on_finish: Callable[[Req], None] | None = None,
) -> RunSummary:
    """Run ``workload`` to completion (or until Ctrl-C: ``interrupted`` in the summary) on
    ``assembly`` and summarise it.

    Arrivals are pulled from the workload as the clock reaches them, and a finished request
    leaves only a few numbers behind (``on_finish(req)`` sees it first), so memory does not
    grow with the number of requests. ``progress(finished, simulated_seconds)`` is called
    after steps that finish requests.
    """
    stepper = Stepper(assembly, on_finish)
    order = itertools.count()
    arrivals = iter(workload.initial())
    upcoming = next(arrivals, None)
    follow_ups: list[tuple[float, int, Req]] = []
    wall_start = time.perf_counter()
    interrupted = False

    try:
        while upcoming is not None or follow_ups or stepper.inflight:
            elapsed = stepper.elapsed()
            while upcoming is not None and upcoming.time <= elapsed:
                stepper.submit(upcoming.time, upcoming.req)
                upcoming = next(arrivals, None)
            while follow_ups and follow_ups[0][0] <= elapsed:
                at, _, req = heapq.heappop(follow_ups)
                stepper.submit(at, req)
            ran, finished = stepper.step()
            if finished:
                for req in finished:
                    follow = workload.follow_up(req, stepper.elapsed())
                    if follow is not None:
                        heapq.heappush(follow_ups, (follow.time, next(order), follow.req))
                if progress is not None:
                    progress(stepper.tally.done + stepper.tally.failed, stepper.elapsed())
            if not ran and (upcoming is not None or follow_ups):
                due = [upcoming.time] if upcoming is not None else []
                due += [follow_ups[0][0]] if follow_ups else []
                stepper.wait_until(min(due))
    except KeyboardInterrupt:
        interrupted = True

    if "kv_events_publisher" in assembly:  # what the cache still holds goes out too
        assembly["kv_events_publisher"].publish_kv_events()
    return stepper.summary(time.perf_counter() - wall_start, interrupted)
