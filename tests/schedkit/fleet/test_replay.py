"""Closed-loop replay: N clients in the workload's order, arrival times ignored."""

from __future__ import annotations

from schedkit.core.schedule_batch import FinishLength
from schedkit.fleet.replay import ClosedLoop, replay_mode
from schedkit.workloads.arrivals import PendingArrivals
from schedkit.workloads.workload import ChatWorkload, shared_prefix_workload


def test_each_client_sends_its_next_request_when_one_ends():
    inner = shared_prefix_workload(num_requests=10, rate=5.0)
    pending = PendingArrivals(ClosedLoop(inner, 3))
    first = list(pending.due(0.0))
    assert [a.req.rid for a in first] == ["w0", "w1", "w2"] and {a.time for a in first} == {0.0}
    assert list(pending.due(100.0)) == []  # nothing more until a request ends
    pending.finished(first[1].req, 4.0)
    [nxt] = list(pending.due(4.0))
    assert (nxt.req.rid, nxt.time) == ("w3", 4.0)
    in_flight = [first[0].req, first[2].req, nxt.req]
    sent = 4
    while in_flight:  # end the oldest; its client sends the next, until the workload is out
        pending.finished(in_flight.pop(0), 5.0)
        arrivals = list(pending.due(5.0))
        assert len(arrivals) <= 1 and len(in_flight) + len(arrivals) <= 3
        in_flight += [a.req for a in arrivals]
        sent += len(arrivals)
    assert sent == 10 and not pending


def test_a_chats_next_turn_goes_before_new_conversations():
    inner = ChatWorkload(num_requests=20, rate=1.0, seed=1, max_turns=3)
    loop = ClosedLoop(inner, 1)
    pending = PendingArrivals(loop)
    [first] = list(pending.due(0.0))
    req = first.req
    conversation = req.rid.rpartition("-t")[0]
    turns_left = inner._remaining_turns[conversation]
    req.output_ids = [7, 8]
    req.finished_reason = FinishLength(length=2)
    pending.finished(req, 2.0)
    [nxt] = list(pending.due(2.0))
    assert nxt.time == 2.0  # no think time: the client sends at once
    expected = f"{conversation}-t1" if turns_left else "c1-t0"
    assert nxt.req.rid == expected
    assert replay_mode(4, None) == "closed loop, 4 clients"
    assert replay_mode(None, 8.0) == "open loop, speedup 8"
