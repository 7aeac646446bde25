"""``schedkit run --plot``: latency CDFs and the running and queued requests over simulated
time, drawn with matplotlib (the optional ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schedkit.workloads.samples import Tally, cdf_points

__all__ = ["PlotError", "check_plot_target", "plot_data", "plot_run", "require_matplotlib"]

INSTALL_HINT = "pip install 'schedkit[plot]'"


class PlotError(RuntimeError):
    """The plot cannot be drawn: matplotlib is not installed, its folder does not exist, or
    its extension is not a format matplotlib writes."""


def require_matplotlib() -> Any:
    """The ``matplotlib.pyplot`` module on the non-interactive Agg backend, or
    ``PlotError`` saying which extra to install."""
    try:
        import matplotlib
    except ImportError:
        raise PlotError(
            f"plotting needs matplotlib, which is not installed; install the plot extra: "
            f"{INSTALL_HINT}"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_plot_target(path: str | Path) -> None:
    """Before a run: ``PlotError`` if the plot could not be drawn into ``path`` after it
    (no matplotlib, no such folder, or an extension matplotlib cannot write)."""
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise PlotError(f"no such directory {folder}")
    suffix = Path(path).suffix.lower().lstrip(".")
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise PlotError(
            f"matplotlib cannot write a .{suffix} file; valid extensions: "
            + ", ".join(sorted(formats))
        )


def plot_data(samples: Tally, max_points: int = 1000) -> dict[str, Any]:
    """What the plot draws: ``cdf`` maps TTFT, ITL and E2E to (seconds, cumulative fraction)
    thinned to ``max_points``; ``timeline`` holds the sampled simulated seconds and running
    and queued request counts."""
    timeline = samples.timeline
    return {
        "cdf": {
            name: cdf_points(values, max_points)
            for name, values in (("TTFT", samples.ttft), ("ITL", samples.itl), ("E2E", samples.e2e))
        },
        "timeline": {
            "seconds": list(timeline.seconds),
            "running": list(timeline.running),
            "queued": list(timeline.queued),
        },
    }


def plot_run(samples: Tally, path: str | Path) -> None:
    """Draw the run's latency CDFs and queue timeline into ``path`` (PNG, or any format
    matplotlib knows by the extension)."""
    plt = require_matplotlib()
    data = plot_data(samples)
    fig, (cdfs, queues) = plt.subplots(1, 2, figsize=(12, 4.5))
    smallest = []
    for name, (seconds, fractions) in data["cdf"].items():
        if seconds:
            cdfs.step([s * 1e3 for s in seconds], fractions, where="post", label=name)
            smallest.append(seconds[0])
    if smallest and min(smallest) > 0:  # latencies span decades; zero has no log
        cdfs.set_xscale("log")
    cdfs.set_xlabel("latency (ms, simulated)")
    cdfs.set_ylabel("fraction of samples at or below")
    cdfs.set_title("latency CDFs")
    cdfs.grid(True, which="both", alpha=0.3)
    cdfs.legend()
    timeline = data["timeline"]
    queues.plot(timeline["seconds"], timeline["running"], label="running")
    queues.plot(timeline["seconds"], timeline["queued"], label="queued")
    queues.set_xlabel("simulated seconds")
    queues.set_ylabel("requests")
    queues.set_title("running and queued requests")
    queues.grid(True, alpha=0.3)
    queues.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
