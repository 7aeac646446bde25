from schedkit.fleet.control_replies import OwedReplies


def test_a_reply_waiting_on_workers_holds_back_the_later_ones():
    owed = OwedReplies()
    owed.owe(b"c", "pause", waiting=[0, 1])
    owed.owe(b"c", "get_loads")
    assert list(owed.ready()) == []
    owed.answered(0, "pause", True, None)
    owed.answered(1, "flush", False, "not that one")  # no flush waits for worker 1
    assert list(owed.ready()) == []
    owed.answered(1, "pause", False, "needs the admin token")
    pause, loads = owed.ready()
    assert (pause.kind, pause.ok, pause.messages) == (
        "pause",
        False,
        ["worker 1: needs the admin token"],
    )
    assert (loads.kind, loads.ok) == ("get_loads", True)
    assert len(owed) == 0


def test_a_lost_worker_fails_what_waited_for_it_and_frees_the_queue():
    owed = OwedReplies()
    owed.owe(b"a", "flush", waiting=[0, 1])
    owed.owe(b"b", "continue", waiting=[1])
    owed.answered(0, "flush", True, None)
    owed.lost(1, "its process exited")
    flush, resume = owed.ready()
    assert not flush.ok and flush.messages == ["worker 1 was taken out: its process exited"]
    assert not resume.ok and resume.identity == b"b"
