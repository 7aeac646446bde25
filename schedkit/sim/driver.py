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
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from schedkit.components.schedule_batch import Req
from schedkit.container import Assembly
from schedkit.sim.samples import RunSamples, percentiles
from schedkit.sim.workload import Workload

__all__ = ["RunSummary", "StuckError", "drive", "percentile"]

# Steps in a row that run nothing while requests are in flight and none is due to arrive.
_MAX_IDLE_STEPS = 1000


class StuckError(RuntimeError):
    """The scheduler stopped making progress with requests still in flight."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation; NaN if empty."""
    return percentiles(values, (q,))[0]


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
    # Time per output token after the first (per request), end to end, time in the queue.
    tpot_p50: float = math.nan
    tpot_p90: float = math.nan
    tpot_p99: float = math.nan
    e2e_p50: float = math.nan
    e2e_p90: float = math.nan
    e2e_p99: float = math.nan
    queue_time_p50: float = math.nan
    queue_time_p90: float = math.nan
    queue_time_p99: float = math.nan
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
            (
                "TPOT p50 / p90 / p99 (ms)",
                f"{self.tpot_p50 * ms:.2f} / {self.tpot_p90 * ms:.2f} / {self.tpot_p99 * ms:.2f}",
            ),
            (
                "E2E p50 / p90 / p99 (s)",
                f"{self.e2e_p50:.2f} / {self.e2e_p90:.2f} / {self.e2e_p99:.2f}",
            ),
            (
                "queue time p50 / p90 / p99 (s)",
                f"{self.queue_time_p50:.2f} / {self.queue_time_p90:.2f} / "
                f"{self.queue_time_p99:.2f}",
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


def drive(
    assembly: Assembly,
    workload: Workload,
    progress: Callable[[int, float], None] | None = None,
    on_finish: Callable[[Req], None] | None = None,
    samples: RunSamples | None = None,
) -> RunSummary:
    """Run ``workload`` to completion (or until Ctrl-C: ``interrupted`` in the summary) on
    ``assembly`` and summarise it.

    Arrivals are pulled from the workload as the clock reaches them, and a finished request
    leaves only a few numbers behind (``on_finish(req)`` sees it first), so memory does not
    grow with the number of requests. ``progress(finished, simulated_seconds)`` is called
    after steps that finish requests. The per-request figures and the timeline of running and
    queued requests (sampled each step, bounded) go to ``samples`` (a new ``RunSamples`` if
    None), where a caller can read them after the run (``--plot`` does).
    """
    scheduler = assembly["scheduler"]
    runner = assembly["model_runner"]
    order = itertools.count()
    arrivals = iter(workload.initial())
    upcoming = next(arrivals, None)
    follow_ups: list[tuple[float, int, Req]] = []
    inflight: dict[str, int] = {}  # rid -> submission number
    tally = RunSamples() if samples is None else samples
    timeline = tally.timeline
    start, wall_start = runner.now(), time.perf_counter()
    idle_steps = 0
    interrupted = False
    finished: list[Req] = []
    scheduler_on_finish = scheduler.on_finish

    def collect(req: Req) -> None:
        scheduler_on_finish(req)
        finished.append(req)

    scheduler.on_finish = collect

    def submit(at: float, req: Req) -> None:
        req.arrival_time = start + at
        inflight[req.rid] = next(order)
        scheduler.submit(req)

    try:
        while upcoming is not None or follow_ups or inflight:
            elapsed = runner.now() - start
            while upcoming is not None and upcoming.time <= elapsed:
                submit(upcoming.time, upcoming.req)
                upcoming = next(arrivals, None)
            while follow_ups and follow_ups[0][0] <= elapsed:
                at, _, req = heapq.heappop(follow_ups)
                submit(at, req)
            ran = scheduler.step()
            timeline.add(
                runner.now() - start,
                len(scheduler.running_batch.reqs),
                len(scheduler.waiting_queue),
            )
            if finished:
                # In submission order: follow-ups (and the workload's draws for them) do not
                # depend on the order requests finished within a step.
                finished.sort(key=lambda r: inflight[r.rid])
                for req in finished:
                    del inflight[req.rid]
                    tally.add(req)
                    if on_finish is not None:
                        on_finish(req)
                    follow = workload.follow_up(req, runner.now() - start)
                    if follow is not None:
                        heapq.heappush(follow_ups, (follow.time, next(order), follow.req))
                finished.clear()
                if progress is not None:
                    progress(tally.done + tally.failed, runner.now() - start)
            if ran:
                idle_steps = 0
            elif upcoming is not None or follow_ups:
                due = [upcoming.time] if upcoming is not None else []
                due += [follow_ups[0][0]] if follow_ups else []
                runner.wait_until(start + min(due))
            else:
                idle_steps += 1
                if idle_steps > _MAX_IDLE_STEPS:
                    raise StuckError(
                        f"{len(inflight)} requests in flight but the scheduler ran nothing for "
                        f"{_MAX_IDLE_STEPS} steps (paused: {scheduler.paused})"
                    )
    except KeyboardInterrupt:
        interrupted = True
    finally:
        scheduler.on_finish = scheduler_on_finish

    if "kv_events_publisher" in assembly:  # what the cache still holds goes out too
        assembly["kv_events_publisher"].publish_kv_events()
    simulated = runner.now() - start
    wall = time.perf_counter() - wall_start
    stats = assembly["metrics_reporter"].stats if "metrics_reporter" in assembly else None
    return RunSummary(
        requests_done=tally.done,
        requests_failed=tally.failed,
        output_tokens=tally.output_tokens,
        request_throughput=tally.done / simulated if simulated > 0 else math.nan,
        output_throughput=tally.output_tokens / simulated if simulated > 0 else math.nan,
        request_throughput_wall=tally.done / wall,
        output_throughput_wall=tally.output_tokens / wall,
        **{
            f"{name}_p{q}": value
            for name in ("ttft", "itl", "tpot", "e2e", "queue_time")
            for q, value in zip((50, 90, 99), percentiles(getattr(tally, name)), strict=True)
        },
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
