"""The dispatcher alone: worker caps, the router queue, refusals, timeouts, lost workers."""

from __future__ import annotations

from array import array

import pytest

from schedkit.core.schedule_batch import FinishAbort, FinishLength, Req
from schedkit.fleet.admission import (
    MAX_REQUEUES,
    TIMED_OUT,
    AdmissionLimits,
    Dispatcher,
    QueueLimits,
)


class Fleet:
    """Fakes for the dispatcher's neighbours: ranks 0..n-1 alive, the lowest rank chosen."""

    def __init__(self, limits: AdmissionLimits, n: int = 2, check: bool = True) -> None:
        self.ranks = list(range(n))
        self.sent: list[tuple[int, str]] = []
        self.aborted: list[tuple[int, str]] = []
        self.closed: list[tuple[str, int | None, str]] = []
        self.d = Dispatcher(
            limits,
            n,
            live_ranks=lambda: self.ranks,
            route=lambda req, ranks: min(ranks),
            deliver=lambda rank, req: self.sent.append((rank, req.rid)) or True,
            abort=lambda rank, req: self.aborted.append((rank, req.rid)),
            closed=lambda req, rank, outcome: self.closed.append((req.rid, rank, outcome)),
            check_worker_limits=check,
        )


def request(rid: str, tokens: int = 10, at: float = 0.0) -> Req:
    req = Req(rid=rid, origin_input_ids=list(range(tokens)))
    req.arrival_time = at
    return req


def finish(req: Req) -> Req:
    req.finished_reason = FinishLength(length=1)
    return req


def test_a_full_worker_refuses_and_the_refusal_is_its_own():
    f = Fleet(AdmissionLimits(worker=QueueLimits(max_requests=1)), n=1)
    a, b = request("a"), request("b")
    f.d.arrive(a)
    f.d.arrive(b)
    assert f.sent == [(0, "a")]
    assert f.closed == [("b", 0, "refused")]
    assert f.d.refused == [1] and isinstance(b.finished_reason, FinishAbort)
    assert f.d.ended(finish(a)) == "done"
    f.d.arrive(request("c"))
    assert f.sent[-1] == (0, "c")


def test_waiting_prompts_are_packed_four_bytes_a_token():
    f = Fleet(AdmissionLimits(worker=QueueLimits(max_requests=1), router=QueueLimits()), n=1)
    f.d.arrive(request("a", 1000))
    f.d.arrive(request("b", 1000))
    [waiting] = f.d.queue
    assert isinstance(waiting.origin_input_ids, array)
    assert waiting.origin_input_ids.itemsize == 4 and list(waiting.origin_input_ids[:3]) == [
        0,
        1,
        2,
    ]


def test_the_router_queue_holds_what_no_worker_has_room_for_in_order():
    limits = AdmissionLimits(worker=QueueLimits(max_tokens=100), router=QueueLimits(max_requests=2))
    f = Fleet(limits)
    reqs = [request(f"r{i}", 60) for i in range(5)]
    for req in reqs:
        f.d.arrive(req)
    assert f.sent == [(0, "r0"), (1, "r1")]
    assert [r.rid for r in f.d.queue] == ["r2", "r3"]
    assert f.closed == [("r4", None, "refused")] and f.d.router_refused == 1
    assert f.d.router_peak_requests == 2 and f.d.router_peak_tokens == 120
    f.d.ended(finish(reqs[1]))
    assert f.d.pump_due
    f.d.pump()
    assert f.sent[-1] == (1, "r2") and [r.rid for r in f.d.queue] == ["r3"]


def test_a_prompt_over_a_workers_token_cap_is_refused_at_once():
    f = Fleet(AdmissionLimits(worker=QueueLimits(max_tokens=50), router=QueueLimits()))
    f.d.arrive(request("big", 51))
    assert f.closed == [("big", None, "refused")] and not f.d.queue


def test_a_worker_refusal_goes_back_to_the_router_queue_head():
    f = Fleet(AdmissionLimits(router=QueueLimits(max_requests=10)), n=1, check=False)
    a, b, c = request("a"), request("b"), request("c")
    for req in (a, b, c):
        f.d.arrive(req)
    assert [rid for _, rid in f.sent] == ["a", "b", "c"]
    f.d.worker_refused(0, c, "full")
    assert [r.rid for r in f.d.queue] == ["c"] and f.d.requeued == [1] and not f.closed
    f.d.pump()  # the worker takes nothing until one of its own ends
    assert [r.rid for r in f.d.queue] == ["c"]
    f.d.ended(finish(a))
    f.d.pump()
    assert f.sent[-1] == (0, "c") and not f.d.queue


def test_a_refusal_with_nothing_else_held_or_too_often_is_final():
    f = Fleet(AdmissionLimits(router=QueueLimits(max_requests=10)), n=1, check=False)
    lone = request("lone")
    f.d.arrive(lone)
    f.d.worker_refused(0, lone, "invalid")
    assert f.closed == [("lone", 0, "refused")] and f.d.refused == [1]
    keep, again = request("keep"), request("again")
    f.d.arrive(keep)
    f.d.arrive(again)
    for _ in range(MAX_REQUEUES):
        f.d.worker_refused(0, again, "invalid")
        f.d.ended(finish(request("x")))  # room again, as if another request ended
        f.d._full.clear()
        f.d.pump()
    f.d.worker_refused(0, again, "invalid")
    assert f.closed[-1] == ("again", 0, "refused")


def test_timeouts_at_the_router_and_on_a_worker():
    limits = AdmissionLimits(
        worker=QueueLimits(max_requests=1), router=QueueLimits(max_requests=5), timeout=2.0
    )
    f = Fleet(limits, n=1)
    a, b = request("a", at=0.0), request("b", at=0.5)
    f.d.arrive(a)
    f.d.arrive(b)
    assert f.d.next_deadline() == 2.0
    f.d.expire(1.9)
    assert not f.aborted and not f.closed
    f.d.expire(2.5)  # a has no first token on worker 0; b waits at the router
    assert f.aborted == [(0, "a")] and f.closed == [("b", None, "timed_out")]
    assert f.d.router_timed_out == 1 and b.finished_reason == FinishAbort(message=TIMED_OUT)
    a.finished_reason = FinishAbort(message="aborted")  # the worker's answer to the abort
    assert f.d.ended(a) == "timed_out" and f.d.timed_out == [1]


def test_a_request_that_started_is_not_timed_out():
    f = Fleet(AdmissionLimits(timeout=1.0), n=1)
    a = request("a")
    f.d.arrive(a)
    a.first_token_time = 0.5
    f.d.expire(5.0)
    assert not f.aborted and f.d.ended(finish(a)) == "done"


def test_a_lost_workers_unstarted_requests_wait_at_the_router():
    f = Fleet(AdmissionLimits(router=QueueLimits(max_requests=10)), n=2)
    a, b = request("a"), request("b")
    f.d.arrive(a)
    f.d.arrive(b)
    a.first_token_time = 0.1
    f.ranks.remove(0)
    assert f.d.worker_lost(0, [a, b]) == [a]  # a had started: it fails with its worker
    assert [r.rid for r in f.d.queue] == ["b"]
    f.d.pump()
    assert f.sent[-1] == (1, "b")


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="max_requests must be > 0"):
        QueueLimits(max_requests=0)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        AdmissionLimits(timeout=-1.0)
    assert not AdmissionLimits().configured
    assert AdmissionLimits(timeout=1.0).configured
