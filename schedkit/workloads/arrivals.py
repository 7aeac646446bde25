"""A workload's requests still to be submitted: its first arrivals, pulled one by one as they
fall due (so a generator keeps memory flat), merged with the follow-ups of finished requests.
The run driver, the offline fleet and the live fleet all take their requests from here."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator

from schedkit.core.schedule_batch import Req
from schedkit.workloads.workload import Arrival, Workload

__all__ = ["PendingArrivals"]


class PendingArrivals:
    """The requests of ``workload`` not yet handed out; true while any is left.

    Follow-ups wait in a heap by time, ties in the order they were added.
    """

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._arrivals = iter(workload.initial())
        self._upcoming: Arrival | None = next(self._arrivals, None)
        self._follow_ups: list[tuple[float, int, Arrival]] = []
        self._added = itertools.count()

    def __bool__(self) -> bool:
        return self._upcoming is not None or bool(self._follow_ups)

    def next_time(self) -> float:
        """When the next request falls due (seconds from the start); inf when none is left."""
        upcoming = self._upcoming.time if self._upcoming is not None else math.inf
        return min(upcoming, self._follow_ups[0][0]) if self._follow_ups else upcoming

    def due(self, now: float) -> Iterator[Arrival]:
        """The requests due at or before ``now``: first arrivals in the workload's order, then
        follow-ups by time."""
        while self._upcoming is not None and self._upcoming.time <= now:
            arrival, self._upcoming = self._upcoming, next(self._arrivals, None)
            yield arrival
        while self._follow_ups and self._follow_ups[0][0] <= now:
            yield heapq.heappop(self._follow_ups)[2]

    def pop(self) -> Arrival:
        """The earliest request (a first arrival before a follow-up due at the same time);
        IndexError when none is left."""
        upcoming = self._upcoming
        if upcoming is not None and (
            not self._follow_ups or upcoming.time <= self._follow_ups[0][0]
        ):
            self._upcoming = next(self._arrivals, None)
            return upcoming
        return heapq.heappop(self._follow_ups)[2]

    def finished(self, req: Req, now: float) -> None:
        """``req`` finished ``now`` seconds from the start: queue the workload's follow-up
        of it, if any."""
        follow = self.workload.follow_up(req, now)
        if follow is not None:
            heapq.heappush(self._follow_ups, (follow.time, next(self._added), follow))
