"""A ``--speedup`` sweep's table: one row per speedup with the fleet's throughput, TTFT and
outcomes."""

from __future__ import annotations

import math
from collections.abc import Sequence

from schedkit.fleet.summary import FleetSummary

__all__ = ["sweep_table"]


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1e3:.1f}"


def sweep_table(speedups: Sequence[float | None], summaries: Sequence[FleetSummary]) -> str:
    """One row per run of the sweep (speedup, then the fleet's figures)."""
    head = (
        "speedup",
        "done",
        "refused",
        "timed out",
        "failed",
        "request/s",
        "output tok/s",
        "TTFT p50 (ms)",
        "TTFT p90 (ms)",
        "TTFT p99 (ms)",
        "E2E p99 (s)",
    )
    rows = [head]
    for speedup, s in zip(speedups, summaries, strict=False):
        f = s.fleet
        rows.append(
            (
                "1" if speedup is None else f"{speedup:g}",
                str(f.requests_done),
                str(f.requests_refused),
                str(f.requests_timed_out),
                str(f.requests_failed),
                f"{f.request_throughput_per_s:.2f}",
                f"{f.output_throughput_tok_per_s:.1f}",
                _ms(f.ttft_p50_s),
                _ms(f.ttft_p90_s),
                _ms(f.ttft_p99_s),
                "-" if math.isnan(f.e2e_p99_s) else f"{f.e2e_p99_s:.2f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(widths[i]) for i, c in enumerate(r)) for r in rows)
