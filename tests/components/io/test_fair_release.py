"""FairRelease alone: sets taken in turn by client, the next only once one was admitted."""

from __future__ import annotations

from array import array

from schedkit.components.io.fair_release import FairRelease

from schedkit.core.schedule_batch import Req


def req(rid: str, tokens: int) -> Req:
    return Req(rid=rid, origin_input_ids=array("I", [1] * tokens))


def admit(reqs: list[Req]) -> list[str]:
    for r in reqs:
        r.scheduled_time = 1.0
    return [r.rid for r in reqs]


def test_a_newcomer_goes_out_in_the_next_set_ahead_of_a_flood():
    fair = FairRelease(max_set_tokens=100)
    for i in range(10):
        fair.hold("flood", req(f"f{i}", 80))
    assert admit(fair.release()) == ["f0", "f1"]
    fair.hold("small", req("s", 5))
    assert [r.rid for r in fair.release()] == ["s", "f2", "f3"]  # s first, then up to 100


def test_the_next_set_waits_until_the_last_was_admitted_or_finished():
    fair = FairRelease(max_set_tokens=10)
    fair.hold("a", req("a0", 20))
    fair.hold("a", req("a1", 20))
    (first,) = fair.release()
    assert fair.release() == [] and not fair.releasable()
    first.finished_reason = object()
    assert [r.rid for r in fair.release()] == ["a1"]


def test_held_requests_can_be_taken_and_dropped():
    fair = FairRelease(max_set_tokens=10)
    for rid in ("a0", "a1", "a2"):
        fair.hold("a", req(rid, 1))
    assert fair.take("a", "a1").rid == "a1" and fair.take("a", "zz") is None
    assert fair.newest_held("a").rid == "a2" and fair.held_of("a") == 2
    assert [r.rid for r in fair.drop("a")] == ["a0", "a2"]
    assert fair.held_count == 0 and fair.release() == []
