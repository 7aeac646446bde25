"""The figures of a fleet run, per worker, at the router and for the whole fleet, as a table
or JSON; every key and label carries its unit. Latencies are seconds on the run's clock
(simulated offline, wall-clock live); throughputs are per second of that clock."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from schedkit.sim.run_summary import json_figures
from schedkit.workloads.samples import PERCENTILES, Tally, Timeline, percentiles

if TYPE_CHECKING:
    from schedkit.fleet.admission import Dispatcher

__all__ = [
    "FleetSummary",
    "RouterFigures",
    "WorkerFigures",
    "WorkerTotals",
    "fleet_summary",
    "merge_tallies",
    "worker_figures",
]

LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue_time")
TIMELINE_POINTS = 64  # per worker in the JSON; the plot draws every sample kept


@attrs.define(kw_only=True)
class WorkerTotals:
    """What a fleet counted for one worker during a run (the input of ``worker_figures``)."""

    tally: Tally = attrs.Factory(Tally)
    routed: int = 0
    refused: int = 0
    timed_out: int = 0
    failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    computed_tokens: int = 0
    peak_held_requests: int = 0
    peak_held_tokens: int = 0
    wall_seconds: float = math.nan
    peak_rss_mib: float = math.nan
    alive: bool = True
    taken_out: str | None = None  # why the router took it out, if it did


@attrs.define(kw_only=True)
class WorkerFigures:
    """One worker's (or the whole fleet's) figures; ``*_s`` in seconds on the run's clock."""

    name: str
    alive: bool
    requests_routed: int
    requests_done: int
    requests_refused: int
    requests_timed_out: int
    requests_failed: int
    input_tokens: int
    output_tokens: int
    request_throughput_per_s: float
    input_throughput_tok_per_s: float
    output_throughput_tok_per_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    itl_p50_s: float
    itl_p90_s: float
    itl_p99_s: float
    e2e_p50_s: float
    e2e_p90_s: float
    e2e_p99_s: float
    queue_time_p50_s: float
    queue_time_p90_s: float
    queue_time_p99_s: float
    prefix_cache_hit_rate: float
    peak_held_requests: int
    peak_held_prompt_tokens: int
    wall_seconds: float
    peak_rss_mib: float
    taken_out: str | None = None
    timeline: Timeline | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: the figures and, for a worker, its load over time (thinned)."""
        figures = json_figures(attrs.asdict(self, filter=lambda a, _: a.name != "timeline"))
        figures["wall_s"] = figures.pop("wall_seconds")
        if self.timeline is not None:
            figures["load_over_time"] = load_over_time(self.timeline, TIMELINE_POINTS)
        return figures


def load_over_time(timeline: Timeline, points: int) -> dict[str, list]:
    """``timeline``'s samples, at most ``points`` of them evenly spread (the last kept)."""
    n = len(timeline.seconds)
    step = max(1, math.ceil(n / points))
    keep = list(range(0, n, step))
    if n and keep[-1] != n - 1:
        keep.append(n - 1)
    return {
        "seconds": [round(timeline.seconds[i], 6) for i in keep],
        "running_requests": [timeline.running[i] for i in keep],
        "queued_requests": [timeline.queued[i] for i in keep],
    }


def _rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.nan


def worker_figures(name: str, totals: WorkerTotals, run_seconds: float) -> WorkerFigures:
    """Figures from ``totals``; throughputs over ``run_seconds``; the hit rate is
    ``cached / (cached + computed)`` prompt tokens."""
    tally = totals.tally
    seen = totals.cached_tokens + totals.computed_tokens
    return WorkerFigures(
        name=name,
        alive=totals.alive,
        requests_routed=totals.routed,
        requests_done=tally.done,
        requests_refused=totals.refused,
        requests_timed_out=totals.timed_out,
        requests_failed=totals.failed,
        input_tokens=totals.input_tokens,
        output_tokens=tally.output_tokens,
        request_throughput_per_s=_rate(tally.done, run_seconds),
        input_throughput_tok_per_s=_rate(totals.input_tokens, run_seconds),
        output_throughput_tok_per_s=_rate(tally.output_tokens, run_seconds),
        **{
            f"{figure}_p{q}_s": value
            for figure in LATENCIES
            for q, value in zip(
                PERCENTILES, percentiles(getattr(tally, figure), PERCENTILES), strict=True
            )
        },
        prefix_cache_hit_rate=totals.cached_tokens / seen if seen else math.nan,
        peak_held_requests=totals.peak_held_requests,
        peak_held_prompt_tokens=totals.peak_held_tokens,
        wall_seconds=totals.wall_seconds,
        peak_rss_mib=totals.peak_rss_mib,
        taken_out=totals.taken_out,
        timeline=None if name == "fleet" else tally.timeline,
    )


def merge_tallies(tallies: Sequence[Tally]) -> Tally:
    """One tally holding every sample of ``tallies`` (no timeline)."""
    merged = Tally()
    for tally in tallies:
        merged.done += tally.done
        merged.failed += tally.failed
        merged.output_tokens += tally.output_tokens
        for name in LATENCIES:
            getattr(merged, name).extend(getattr(tally, name))
    return merged


@attrs.define(kw_only=True)
class RouterFigures:
    """What ended at the router: refused (its queue full, or a prompt no worker may take),
    timed out in its queue, failed (no live worker); its queue's peak; requests a worker
    refused that went back to its queue."""

    requests_refused: int = 0
    requests_timed_out: int = 0
    requests_failed: int = 0
    peak_queued_requests: int = 0
    peak_queued_prompt_tokens: int = 0
    requests_requeued: int = 0


def router_figures(d: Dispatcher) -> RouterFigures:
    """What ended at the router, as a fleet's dispatcher counted it."""
    return RouterFigures(
        requests_refused=d.router_refused,
        requests_timed_out=d.router_timed_out,
        requests_failed=d.router_failed,
        peak_queued_requests=d.router_peak_requests,
        peak_queued_prompt_tokens=d.router_peak_tokens,
        requests_requeued=sum(d.requeued),
    )


@attrs.define(kw_only=True)
class FleetSummary:
    """A fleet run: the policy, the mode (offline or live), how the workload was replayed,
    the admission limits, each worker's figures, the router's and the fleet's.
    ``simulated_seconds`` is NaN for a live run (its clock is the wall clock)."""

    policy: str
    mode: str
    replay: str
    admission: str
    workers: list[WorkerFigures]
    router: RouterFigures
    fleet: WorkerFigures
    run_seconds: float
    simulated_seconds: float
    wall_seconds: float
    interrupted: bool = False
    samples: Tally | None = None  # every worker's latency samples, for the plot
    # Wall seconds before the run: building the workers (offline) or starting them (live).
    setup_seconds: float = math.nan

    @property
    def load_imbalance(self) -> float:
        """Most requests routed to one worker / mean per worker (1.0 is perfectly even)."""
        routed = [w.requests_routed for w in self.workers]
        mean = sum(routed) / len(routed) if routed else 0
        return max(routed) / mean if mean else math.nan

    @property
    def requests_not_done(self) -> int:
        """Requests refused, timed out or failed anywhere."""
        f = self.fleet
        return f.requests_refused + f.requests_timed_out + f.requests_failed

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object (NaN as null)."""
        return json_figures(
            {
                "policy": self.policy,
                "mode": self.mode,
                "replay": self.replay,
                "admission": self.admission,
                "workers": [w.to_dict() for w in self.workers],
                "router": attrs.asdict(self.router),
                "fleet": self.fleet.to_dict(),
                "load_imbalance": self.load_imbalance,
                "run_s": self.run_seconds,
                "simulated_s": self.simulated_seconds,
                "wall_s": self.wall_seconds,
                "setup_wall_s": self.setup_seconds,
                "interrupted": self.interrupted,
            }
        )


def fleet_summary(
    *,
    policy: str,
    mode: str,
    replay: str,
    admission: str,
    workers: Sequence[WorkerTotals],
    router: RouterFigures,
    run_seconds: float,
    simulated_seconds: float,
    wall_seconds: float,
    interrupted: bool = False,
    setup_seconds: float = math.nan,
) -> FleetSummary:
    """A ``FleetSummary`` from each worker's totals and the router's figures; the fleet's
    refusals, timeouts and failures add the router's to the workers'."""
    figures = [worker_figures(str(rank), w, run_seconds) for rank, w in enumerate(workers)]
    measured = [w.peak_rss_mib for w in workers if not math.isnan(w.peak_rss_mib)]
    merged = merge_tallies([w.tally for w in workers])
    whole = WorkerTotals(
        tally=merged,
        routed=sum(w.routed for w in workers),
        refused=sum(w.refused for w in workers) + router.requests_refused,
        timed_out=sum(w.timed_out for w in workers) + router.requests_timed_out,
        failed=sum(w.failed for w in workers) + router.requests_failed,
        input_tokens=sum(w.input_tokens for w in workers),
        cached_tokens=sum(w.cached_tokens for w in workers),
        computed_tokens=sum(w.computed_tokens for w in workers),
        peak_held_requests=max((w.peak_held_requests for w in workers), default=0),
        peak_held_tokens=max((w.peak_held_tokens for w in workers), default=0),
        wall_seconds=wall_seconds,
        peak_rss_mib=max(measured, default=math.nan),
    )
    return FleetSummary(
        policy=policy,
        mode=mode,
        replay=replay,
        admission=admission,
        workers=figures,
        router=router,
        fleet=worker_figures("fleet", whole, run_seconds),
        run_seconds=run_seconds,
        simulated_seconds=simulated_seconds,
        wall_seconds=wall_seconds,
        interrupted=interrupted,
        samples=merged,
        setup_seconds=setup_seconds,
    )
