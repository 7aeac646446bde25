"""A model that runs ``factor`` times faster: every modelled time term divided by the factor.

A live fleet on few cores replays a long trace in less wall time when the trace and the model
are both sped up by the same factor (``open_trace(..., speedup=factor)``): arrivals and
steps keep their proportions, so the queues are those of the unscaled run, and every latency
is ``1 / factor`` of it. What does not scale is the CPU the router and the schedulers spend
per request and step, which becomes ``factor`` times larger a share of each step.
"""

from __future__ import annotations

import copy
import math

from schedkit.runner.step_costs import TIME_TERMS

__all__ = ["TIME_TERMS", "faster_model"]


def faster_model(overlay: dict, factor: float) -> dict:
    """A copy of ``overlay`` (one giving every ``model_runner`` time term, as a preset's
    does) with each time term divided by ``factor``."""
    if not (0 < factor < math.inf):
        raise ValueError(f"a time factor must be a finite number > 0, got {factor!r}")
    scaled = copy.deepcopy(overlay)
    args = scaled.get("components", {}).get("model_runner", {}).get("args", {})
    missing = [t for t in TIME_TERMS if t not in args]
    if missing:
        raise ValueError(f"the overlay gives no model_runner {', '.join(missing)} to scale")
    for term in TIME_TERMS:
        args[term] = args[term] / factor
    return scaled
