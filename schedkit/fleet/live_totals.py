"""What the live fleet counts as its requests end, per worker, and the run's summary of it."""

from __future__ import annotations

import math

from schedkit.core.schedule_batch import Req
from schedkit.fleet.admission import Outcome, describe_admission
from schedkit.fleet.summary import FleetSummary, WorkerTotals, fleet_summary, router_figures

__all__ = ["LiveTotals"]


class LiveTotals:
    """``_dispatcher_closed``, ``_end`` and ``_summary`` of ``LiveFleet``. Mixed into
    ``LiveFleet``.

    Uses the fleet's ``router``, ``dispatcher``, ``record``, ``_pending``, ``_progress``,
    ``_sent_at``, ``_elapsed``, its per-worker ``_tallies``, ``_failed``, ``_input_tokens`` and
    ``routed``, and the workers' ``stats``, ``alive``, ``deaths`` and ``startup_seconds``.
    """

    __slots__ = ()

    def _dispatcher_closed(self, req: Req, rank: int | None, outcome: Outcome) -> None:
        """A request the dispatcher ended: refused or timed out at the router, refused by a
        worker, or failed for want of a worker."""
        self._end(req, rank, outcome)

    def _end(self, req: Req, rank: int | None, outcome: Outcome) -> None:
        req.finished_output = True
        self._sent_at.pop(req.rid, None)
        if self.router is not None:
            self.router.finished(req.rid)
        if rank is not None and outcome in ("done", "failed"):
            self._tallies[rank].add(req)
            if outcome == "done":
                self._input_tokens[rank] += len(req.origin_input_ids)
            else:
                self._failed[rank] += 1
        if self.record is not None:
            self.record(req, rank, outcome, 0.0)
        if self._pending is not None:
            self._pending.finished(req, self._elapsed())
        self._ended += 1
        if self._progress is not None:
            self._progress(self._ended, self._elapsed())

    def _summary(self, wall: float, interrupted: bool) -> FleetSummary:
        d = self.dispatcher
        stats = [self.stats.get(rank, {}) for rank in range(self.num_workers)]
        workers = [
            WorkerTotals(
                tally=self._tallies[rank],
                routed=self.routed[rank],
                refused=d.refused[rank],
                timed_out=d.timed_out[rank],
                failed=self._failed[rank],
                input_tokens=self._input_tokens[rank],
                cached_tokens=s.get("cached_tokens", 0),
                computed_tokens=s.get("computed_tokens", 0),
                peak_held_requests=d.peak_held_requests[rank],
                peak_held_tokens=d.peak_held_tokens[rank],
                wall_seconds=s.get("uptime_seconds", math.nan),
                peak_rss_mib=s.get("peak_rss_mb", math.nan),
                alive=self.alive[rank],
                taken_out=self.deaths.get(rank),
            )
            for rank, s in enumerate(stats)
        ]
        return fleet_summary(
            policy=self.policy,
            mode="live",
            replay=self.replay,
            admission=describe_admission(self.admission),
            workers=workers,
            router=router_figures(d),
            run_seconds=wall,
            simulated_seconds=math.nan,
            wall_seconds=wall,
            setup_seconds=self.startup_seconds,
            interrupted=interrupted,
        )
