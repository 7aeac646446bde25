"""FairRelease alone: requests released in turns by client, a per-client cap on what waits
unadmitted in the scheduler, and a newcomer's turn ahead of a flood's waiting request."""

from __future__ import annotations

from array import array

from schedkit.components.io.fair_release import FairRelease
from schedkit.core.schedule_batch import FinishAbort, Req


def req(rid: str, tokens: int) -> Req:
    return Req(rid=rid, origin_input_ids=array("I", [1] * tokens))


def rids(reqs: list[Req]) -> list[str]:
    return [r.rid for r in reqs]


def test_a_flood_waits_at_the_edge_and_a_newcomer_goes_ahead_of_its_waiting_request_once():
    fair = FairRelease(max_client_tokens=100)
    for i in range(10):
        fair.hold("flood", req(f"f{i}", 80))
    out, requeue = fair.release()
    assert rids(out) == ["f0", "f1"] and requeue == []  # 160 tokens: over the cap, no more
    assert fair.release() == ([], []) and not fair.releasable()
    fair.hold("small", req("s", 5))
    out, requeue = fair.release()
    assert rids(out) == ["s"] and requeue == ["f0", "f1"]
    fair.hold("other", req("o", 5))
    out, requeue = fair.release()
    assert rids(out) == ["o"] and requeue == ["s"]  # f0 and f1 yield only once


def test_a_client_releases_more_once_its_requests_were_admitted_or_finished():
    fair = FairRelease(max_client_tokens=100)
    for i in range(4):
        fair.hold("a", req(f"a{i}", 60))
    first, _ = fair.release()
    assert rids(first) == ["a0", "a1"] and not fair.releasable()  # 120 tokens unadmitted
    first[0].scheduled_time = 1.0
    (a2,), _ = fair.release()
    assert a2.rid == "a2" and not fair.releasable()
    first[1].finished_reason = FinishAbort("aborted")
    assert rids(fair.release()[0]) == ["a3"]


def test_held_requests_can_be_taken_and_dropped():
    fair = FairRelease(max_client_tokens=1)
    fair.hold("a", req("a0", 1))
    fair.release()
    for rid in ("a1", "a2", "a3"):
        fair.hold("a", req(rid, 1))
    assert fair.take("a", "a2").rid == "a2" and fair.take("a", "zz") is None
    assert fair.newest_held("a").rid == "a3" and fair.held_of("a") == 2
    assert rids(fair.drop("a")) == ["a1", "a3"]
    assert fair.held_count == 0 and fair.release() == ([], [])
