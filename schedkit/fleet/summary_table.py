"""``fleet_table(summary)``: the fleet's figures as ``schedkit run`` shows one scheduler's,
then a row per worker with its counts, latencies and load over the run."""

from __future__ import annotations

import math

from schedkit.fleet.summary import FleetSummary, WorkerFigures

__all__ = ["fleet_table"]


def _shown(value: float, spec: str, scale: float = 1.0) -> str:
    """``value * scale`` formatted, or "-" when nothing was measured (NaN)."""
    return "-" if math.isnan(value) else format(value * scale, spec)


def _three(w: WorkerFigures, figure: str, spec: str, scale: float) -> str:
    return " / ".join(_shown(getattr(w, f"{figure}_p{q}_s"), spec, scale) for q in (50, 90, 99))


def _fleet_rows(s: FleetSummary) -> list[tuple[str, str]]:
    f, r = s.fleet, s.router
    clock = "simulated" if s.mode == "offline" else "wall"
    rows = [
        ("router policy (mode)", f"{s.policy} ({s.mode})"),
        ("replay", s.replay),
        ("admission", s.admission),
        (
            "requests done / refused / timed out / failed",
            f"{f.requests_done} / {f.requests_refused} / {f.requests_timed_out} / "
            f"{f.requests_failed}",
        ),
        (
            "at the router: refused / timed out / failed / requeued",
            f"{r.requests_refused} / {r.requests_timed_out} / {r.requests_failed} / "
            f"{r.requests_requeued}",
        ),
        (
            "router queue peak (requests | prompt tokens)",
            f"{r.peak_queued_requests} | {r.peak_queued_prompt_tokens}",
        ),
        ("input | output tokens (done requests)", f"{f.input_tokens} | {f.output_tokens}"),
        (
            f"throughput (request/s | input tok/s | output tok/s, {clock})",
            f"{_shown(f.request_throughput_per_s, '.2f')} | "
            f"{_shown(f.input_throughput_tok_per_s, '.1f')} | "
            f"{_shown(f.output_throughput_tok_per_s, '.1f')}",
        ),
        ("TTFT p50 / p90 / p99 (ms)", _three(f, "ttft", ".1f", 1e3)),
        ("TPOT p50 / p90 / p99 (ms)", _three(f, "tpot", ".2f", 1e3)),
        ("ITL p50 / p90 / p99 (ms)", _three(f, "itl", ".2f", 1e3)),
        ("E2E p50 / p90 / p99 (s)", _three(f, "e2e", ".2f", 1.0)),
        ("queue time p50 / p90 / p99 (s)", _three(f, "queue_time", ".2f", 1.0)),
        ("prefix-cache hit rate", _shown(f.prefix_cache_hit_rate, ".1%")),
        ("load imbalance (max / mean requests routed)", _shown(s.load_imbalance, ".2f")),
        (
            "simulated | wall seconds",
            f"{_shown(s.simulated_seconds, '.2f')} | {s.wall_seconds:.2f}",
        ),
        (
            f"workers {'built' if s.mode == 'offline' else 'started'} before the run (wall s)",
            _shown(s.setup_seconds, ".2f"),
        ),
        ("peak memory (RSS, MiB)", _shown(f.peak_rss_mib, ".0f")),
    ]
    if s.interrupted:
        rows.insert(0, ("interrupted", "yes: figures cover the requests ended so far"))
    return rows


def _queued(w: WorkerFigures) -> str:
    """Mean / peak queued requests over the worker's load samples."""
    timeline = w.timeline
    if timeline is None or not len(timeline.queued):
        return "-"
    queued = timeline.queued
    return f"{sum(queued) / len(queued):.1f} / {max(queued)}"


def _worker_rows(s: FleetSummary) -> list[tuple[str, ...]]:
    head = (
        "worker",
        "routed",
        "done",
        "refused",
        "timed out",
        "failed",
        "TTFT p50/p90/p99 (ms)",
        "E2E p50/p90/p99 (s)",
        "out tok/s",
        "hit rate",
        "held peak (req)",
        "queued mean/peak (req)",
        "RSS (MiB)",
    )
    rows = [head]
    for w in s.workers:
        rows.append(
            (
                w.name if w.alive else f"{w.name} (dead)",
                str(w.requests_routed),
                str(w.requests_done),
                str(w.requests_refused),
                str(w.requests_timed_out),
                str(w.requests_failed),
                _three(w, "ttft", ".1f", 1e3),
                _three(w, "e2e", ".2f", 1.0),
                _shown(w.output_throughput_tok_per_s, ".1f"),
                _shown(w.prefix_cache_hit_rate, ".1%"),
                str(w.peak_held_requests),
                _queued(w),
                _shown(w.peak_rss_mib, ".0f"),
            )
        )
    return rows


def fleet_table(s: FleetSummary) -> str:
    """The fleet block (as ``schedkit run`` shows one scheduler's), a blank line, then one
    row per worker; "-" for what was not measured."""
    fleet = _fleet_rows(s)
    width = max(len(name) for name, _ in fleet)
    lines = [f"{name.ljust(width)}  {value}" for name, value in fleet]
    rows = _worker_rows(s)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines.append("")
    lines += ["  ".join(c.rjust(widths[i]) for i, c in enumerate(r)) for r in rows]
    return "\n".join(lines)
