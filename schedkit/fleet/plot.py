"""``schedkit fleet --plot``: the fleet's latency CDFs and each worker's load (running and
queued requests) over the run, drawn with matplotlib (the optional ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path

from schedkit.fleet.summary import FleetSummary
from schedkit.sim.plot import require_matplotlib
from schedkit.workloads.samples import cdf_points

__all__ = ["plot_fleet"]


def plot_fleet(summary: FleetSummary, path: str | Path) -> None:
    """Draw ``summary``'s latency CDFs and per-worker load over time into ``path`` (PNG, or
    any format matplotlib knows by the extension)."""
    plt = require_matplotlib()
    clock = "simulated" if summary.mode == "offline" else "wall-clock"
    fig, (cdfs, loads) = plt.subplots(1, 2, figsize=(13, 4.8))
    samples = summary.samples
    smallest = []
    for name in ("ttft", "itl", "e2e"):
        values = getattr(samples, name) if samples is not None else []
        seconds, fractions = cdf_points(values, 1000)
        if seconds:
            cdfs.step([s * 1e3 for s in seconds], fractions, where="post", label=name.upper())
            smallest.append(seconds[0])
    if smallest and min(smallest) > 0:  # latencies span decades; zero has no log
        cdfs.set_xscale("log")
    cdfs.set_xlabel(f"latency (ms, {clock})")
    cdfs.set_ylabel("fraction of samples at or below")
    cdfs.set_title(f"latency CDFs: router {summary.policy}, {summary.replay}")
    cdfs.grid(True, which="both", alpha=0.3)
    cdfs.legend()
    for worker in summary.workers:
        timeline = worker.timeline
        if timeline is None or not len(timeline.seconds):
            continue
        held = [r + q for r, q in zip(timeline.running, timeline.queued, strict=True)]
        loads.plot(list(timeline.seconds), held, label=f"worker {worker.name}", linewidth=1)
    loads.set_xlabel(f"seconds ({clock})")
    loads.set_ylabel("requests running + queued")
    loads.set_title("load per worker over time")
    loads.grid(True, alpha=0.3)
    if summary.workers and len(summary.workers) <= 16:
        loads.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
