"""PendingArrivals: first arrivals pulled as they fall due, merged with follow-ups."""

from __future__ import annotations

import math

import attrs

from schedkit.core.schedule_batch import Req
from schedkit.workloads.arrivals import PendingArrivals
from schedkit.workloads.workload import Arrival


def arrival(rid: str, at: float) -> Arrival:
    return Arrival(at, Req(rid=rid, origin_input_ids=[1, 2]))


@attrs.define
class TwoTurns:
    """First arrivals from a generator that records how far it was pulled; each first turn
    is followed ``delay`` s after it finishes by a second turn, which has none."""

    times: list[float]
    delay: float = 1.0
    pulled: int = 0

    def initial(self):
        for i, at in enumerate(self.times):
            self.pulled += 1
            yield arrival(f"c{i}", at)

    def follow_up(self, req: Req, now: float) -> Arrival | None:
        if req.rid.endswith("-2"):
            return None
        return arrival(f"{req.rid}-2", now + self.delay)


def rids(arrivals) -> list[str]:
    return [a.req.rid for a in arrivals]


def test_due_gives_first_arrivals_then_follow_ups_pulling_only_what_is_due():
    workload = TwoTurns([0.0, 2.0, 2.0, 5.0])
    pending = PendingArrivals(workload)
    assert workload.pulled == 1 and pending.next_time() == 0.0
    assert rids(pending.due(0.5)) == ["c0"]
    assert workload.pulled == 2  # the next arrival, not yet due, is held
    pending.finished(Req(rid="c0", origin_input_ids=[1]), 0.5)  # c0-2 at 1.5
    pending.finished(Req(rid="c9", origin_input_ids=[1]), 0.0)  # c9-2 at 1.0
    assert pending.next_time() == 1.0
    # Every first arrival due comes before any follow-up, even an earlier one.
    assert rids(pending.due(2.0)) == ["c1", "c2", "c9-2", "c0-2"]
    assert pending and pending.next_time() == 5.0
    pending.finished(Req(rid="c1-2", origin_input_ids=[1]), 2.0)  # no follow-up
    assert rids(pending.due(10.0)) == ["c3"]
    assert not pending and pending.next_time() == math.inf


def test_pop_gives_the_earliest_a_first_arrival_winning_a_tie():
    pending = PendingArrivals(TwoTurns([1.0, 3.0], delay=0.0))
    pending.finished(Req(rid="a", origin_input_ids=[1]), 1.0)  # a-2 at 1.0
    pending.finished(Req(rid="b", origin_input_ids=[1]), 0.5)  # b-2 at 0.5
    pending.finished(Req(rid="c", origin_input_ids=[1]), 1.0)  # c-2 at 1.0, after a-2
    popped = [pending.pop() for _ in range(5)]
    assert rids(popped) == ["b-2", "c0", "a-2", "c-2", "c1"]
    assert [a.time for a in popped] == [0.5, 1.0, 1.0, 1.0, 3.0]
    assert not pending
