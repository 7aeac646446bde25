"""The figures of a run: ``RunSummary`` (one assembly's, as ``schedkit run`` prints them) and
what the fleet's summary shares with it (the process's peak memory, NaN as null in JSON)."""

from __future__ import annotations

import math
import resource
import sys
from collections.abc import Mapping
from typing import Any

import attrs

from schedkit.assembly.container import Assembly
from schedkit.workloads.samples import Tally, percentiles

__all__ = ["RunSummary", "json_figures", "peak_rss_mb", "summarize"]


def json_figures(figures: Mapping[str, Any]) -> dict[str, Any]:
    """``figures`` with each NaN (a figure nothing measured) as None, JSON's null."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in figures.items()}


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
        """The ``--json`` object (NaN as null)."""
        return json_figures(attrs.asdict(self))

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


def summarize(
    assembly: Assembly, tally: Tally, simulated: float, wall: float, interrupted: bool = False
) -> RunSummary:
    """The ``RunSummary`` of ``tally`` on ``assembly``: latencies from the finished requests,
    the prefix-cache hit rate and batch figures from the scheduler, KV-event counts from the
    publisher (no figure from the metrics reporter, so swapping it changes none)."""
    scheduler = assembly["scheduler"]
    cached = scheduler.prefill_tokens_cached
    seen = cached + scheduler.prefill_tokens_computed
    return RunSummary(
        requests_done=tally.done,
        requests_failed=tally.failed,
        output_tokens=tally.output_tokens,
        request_throughput=tally.done / simulated if simulated > 0 else math.nan,
        output_throughput=tally.output_tokens / simulated if simulated > 0 else math.nan,
        request_throughput_wall=tally.done / wall if wall > 0 else math.nan,
        output_throughput_wall=tally.output_tokens / wall if wall > 0 else math.nan,
        **{
            f"{name}_p{q}": value
            for name in ("ttft", "itl", "tpot", "e2e", "queue_time")
            for q, value in zip((50, 90, 99), percentiles(getattr(tally, name)), strict=True)
        },
        prefix_cache_hit_rate=cached / seen if seen else math.nan,
        kv_events_published=_counter(assembly, "kv_events_publisher", "accepted"),
        kv_events_dropped=_counter(assembly, "kv_events_publisher", "dropped"),
        peak_running_requests=scheduler.peak_running_requests,
        retractions=scheduler.num_retracted,
        wall_seconds=wall,
        simulated_seconds=simulated,
        peak_rss_mb=peak_rss_mb(),
        interrupted=interrupted,
    )
