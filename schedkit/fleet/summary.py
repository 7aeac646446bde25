"""The figures of a fleet run: per worker and for the whole fleet, as a table or JSON."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from schedkit.sim.run_summary import json_figures
from schedkit.workloads.samples import Tally, percentiles

__all__ = [
    "FleetSummary",
    "WorkerFigures",
    "fleet_summary",
    "merge_tallies",
    "worker_figures",
]


@attrs.define(kw_only=True)
class WorkerFigures:
    """One worker's (or the fleet's) figures; latencies in seconds on the run's clock."""

    name: str
    requests_routed: int
    requests_done: int
    requests_failed: int
    output_tokens: int
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    tpot_p50: float
    tpot_p90: float
    tpot_p99: float
    itl_p50: float
    itl_p90: float
    itl_p99: float
    e2e_p50: float
    e2e_p90: float
    e2e_p99: float
    prefix_cache_hit_rate: float
    wall_seconds: float
    peak_rss_mb: float
    alive: bool = True


def _worker_json(figures: WorkerFigures) -> dict[str, Any]:
    """A worker's figures as JSON: latencies ``_s`` (seconds), memory ``_mib``."""
    values = attrs.asdict(figures)
    renamed = {"wall_seconds": "wall_s", "peak_rss_mb": "peak_rss_mib"}
    return json_figures(
        {
            renamed.get(k) or (f"{k}_s" if k.rpartition("_")[2] in ("p50", "p90", "p99") else k): v
            for k, v in values.items()
        }
    )


def worker_figures(
    name: str,
    tally: Tally,
    *,
    routed: int,
    cached_tokens: int,
    computed_tokens: int,
    wall_seconds: float = math.nan,
    peak_rss_mb: float = math.nan,
    alive: bool = True,
) -> WorkerFigures:
    """Figures from a tally; the hit rate is ``cached / (cached + computed)`` prompt tokens."""
    seen = cached_tokens + computed_tokens
    return WorkerFigures(
        name=name,
        requests_routed=routed,
        requests_done=tally.done,
        requests_failed=tally.failed,
        output_tokens=tally.output_tokens,
        **{
            f"{figure}_p{q}": value
            for figure in ("ttft", "tpot", "itl", "e2e")
            for q, value in zip(
                (50, 90, 99), percentiles(getattr(tally, figure), (50, 90, 99)), strict=True
            )
        },
        prefix_cache_hit_rate=cached_tokens / seen if seen else math.nan,
        wall_seconds=wall_seconds,
        peak_rss_mb=peak_rss_mb,
        alive=alive,
    )


def merge_tallies(tallies: Sequence[Tally]) -> Tally:
    """One tally holding every sample of ``tallies``."""
    merged = Tally()
    for tally in tallies:
        merged.done += tally.done
        merged.failed += tally.failed
        merged.output_tokens += tally.output_tokens
        merged.ttft.extend(tally.ttft)
        merged.itl.extend(tally.itl)
        merged.tpot.extend(tally.tpot)
        merged.e2e.extend(tally.e2e)
    return merged


@attrs.define(kw_only=True)
class FleetSummary:
    """A fleet run: the router policy, each worker's figures, the fleet's, and the load
    imbalance (the most requests routed to one worker over the mean per worker).
    ``simulated_seconds`` is NaN for a live run (its latencies are wall-clock seconds)."""

    policy: str
    mode: str
    workers: list[WorkerFigures]
    fleet: WorkerFigures
    simulated_seconds: float
    wall_seconds: float
    interrupted: bool = False
    # Wall seconds before the run: building the workers (offline) or starting them (live).
    setup_seconds: float = math.nan

    @property
    def load_imbalance(self) -> float:
        """Most requests routed to one worker / mean per worker (1.0 is perfectly even)."""
        routed = [w.requests_routed for w in self.workers]
        mean = sum(routed) / len(routed) if routed else 0
        return max(routed) / mean if mean else math.nan

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object (NaN as null)."""

        return json_figures(
            {
                "policy": self.policy,
                "mode": self.mode,
                "workers": [_worker_json(w) for w in self.workers],
                "fleet": _worker_json(self.fleet),
                "load_imbalance": self.load_imbalance,
                "simulated_s": self.simulated_seconds,
                "wall_s": self.wall_seconds,
                "setup_wall_s": self.setup_seconds,
                "interrupted": self.interrupted,
            }
        )

    def table(self) -> str:
        """One row per worker and one for the fleet; TTFT, TPOT and ITL in ms, E2E in s, "-"
        for what was not measured (no request finished, or no figure from a worker)."""
        head = (
            "worker",
            "routed",
            "done",
            "failed",
            "TTFT ms p50/p90/p99",
            "TPOT ms p50/p90/p99",
            "ITL ms p50/p90/p99",
            "E2E s p50/p90/p99",
            "hit rate",
            "wall s",
            "RSS MiB",
        )

        def shown(value: float, spec: str) -> str:  # "-": nothing measured (NaN)
            return "-" if math.isnan(value) else format(value, spec)

        def ms(*values: float) -> str:
            return "/".join(shown(v * 1e3, ".1f") for v in values)

        def s(*values: float) -> str:
            return "/".join(shown(v, ".2f") for v in values)

        def row(w: WorkerFigures) -> tuple[str, ...]:
            return (
                w.name if w.alive else f"{w.name} (dead)",
                str(w.requests_routed),
                str(w.requests_done),
                str(w.requests_failed),
                ms(w.ttft_p50, w.ttft_p90, w.ttft_p99),
                ms(w.tpot_p50, w.tpot_p90, w.tpot_p99),
                ms(w.itl_p50, w.itl_p90, w.itl_p99),
                s(w.e2e_p50, w.e2e_p90, w.e2e_p99),
                shown(w.prefix_cache_hit_rate, ".1%"),
                shown(w.wall_seconds, ".2f"),
                shown(w.peak_rss_mb, ".0f"),
            )

        rows = [head, *(row(w) for w in self.workers), row(self.fleet)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.rjust(widths[i]) for i, c in enumerate(r)) for r in rows]
        lines.insert(len(lines) - 1, "-" * len(lines[0]))
        seconds = f"wall seconds {self.wall_seconds:.2f}"
        if not math.isnan(self.setup_seconds):
            what = "building" if self.mode == "offline" else "starting"
            seconds += f" (and {self.setup_seconds:.2f} {what} the workers before)"
        if not math.isnan(self.simulated_seconds):
            seconds = f"simulated seconds {self.simulated_seconds:.2f}; {seconds}"
        lines += [
            f"router {self.policy} ({self.mode}); load imbalance (max / mean requests per "
            f"worker) {self.load_imbalance:.2f}",
            seconds,
        ]
        if self.interrupted:
            lines.insert(0, "interrupted: figures cover the requests finished so far")
        return "\n".join(lines)


def fleet_summary(
    *,
    policy: str,
    mode: str,
    tallies: Sequence[Tally],
    routed: Sequence[int],
    tokens: Sequence[tuple[int, int]],
    walls: Sequence[float],
    rss: Sequence[float],
    alive: Sequence[bool],
    simulated_seconds: float,
    wall_seconds: float,
    interrupted: bool = False,
    unrouted: Tally | None = None,
    setup_seconds: float = math.nan,
) -> FleetSummary:
    """A ``FleetSummary`` from each worker's tally, requests routed to it, (cached, computed)
    prompt tokens, wall seconds, peak RSS and liveness; ``unrouted`` holds the requests no
    worker took (they count for the fleet only)."""
    workers = [
        worker_figures(
            str(rank),
            tallies[rank],
            routed=routed[rank],
            cached_tokens=tokens[rank][0],
            computed_tokens=tokens[rank][1],
            wall_seconds=walls[rank],
            peak_rss_mb=rss[rank],
            alive=alive[rank],
        )
        for rank in range(len(tallies))
    ]
    measured = [r for r in rss if not math.isnan(r)]
    fleet = worker_figures(
        "fleet",
        merge_tallies([*tallies, *([unrouted] if unrouted is not None else [])]),
        routed=sum(routed),
        cached_tokens=sum(t[0] for t in tokens),
        computed_tokens=sum(t[1] for t in tokens),
        wall_seconds=wall_seconds,
        peak_rss_mb=max(measured, default=math.nan),
    )
    return FleetSummary(
        policy=policy,
        mode=mode,
        workers=workers,
        fleet=fleet,
        simulated_seconds=simulated_seconds,
        wall_seconds=wall_seconds,
        interrupted=interrupted,
        setup_seconds=setup_seconds,
    )
