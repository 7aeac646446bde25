"""SortWindow: arrivals come out in time order within the window; a later one that falls
behind what was let out is named."""

from __future__ import annotations

from schedkit.workloads import sort_window
from schedkit.workloads.sort_window import SortWindow


def test_arrivals_come_out_in_time_order_ties_in_file_order():
    window = SortWindow()
    out = []
    for line, time in enumerate([3.0, 1.0, 2.0, 1.0], 1):
        out += window.push(time, line, f"line{line}", 1)
    out += window.drain()
    assert out == ["line2", "line4", "line3", "line1"]


def test_the_window_lets_out_the_earliest_when_full_and_names_what_falls_behind(monkeypatch):
    monkeypatch.setattr(sort_window, "SORT_WINDOW_ITEMS", 2)
    window = SortWindow()
    assert list(window.push(5.0, 1, "a", 1)) == []
    assert list(window.push(4.0, 2, "b", 1)) == []
    assert list(window.push(6.0, 3, "c", 1)) == ["b"]
    assert window.late(3.0) == (4.0, 2) and window.late(4.0) is None


def test_the_window_holds_a_bounded_number_of_tokens(monkeypatch):
    monkeypatch.setattr(sort_window, "SORT_WINDOW_TOKENS", 10)
    window = SortWindow()
    assert list(window.push(2.0, 1, "a", 6)) == []
    assert list(window.push(1.0, 2, "b", 6)) == ["b"]  # 12 tokens held: the earliest goes
    # Past the bound by itself: it stays, alone (the window never holds less than one).
    assert list(window.push(3.0, 3, "huge", 100)) == ["a"]
    assert list(window.drain()) == ["huge"]
