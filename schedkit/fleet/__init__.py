"""A fleet of schedulers behind a KV-aware router: offline (one process, one virtual
timeline) and live (one process per worker on the wall clock)."""

from schedkit.fleet.offline import run_offline
from schedkit.fleet.summary import FleetSummary, WorkerFigures

__all__ = ["FleetSummary", "WorkerFigures", "run_offline"]
