"""The options ``run`` and ``fleet`` share: the progress bar and when it shows."""

from __future__ import annotations

import argparse
import sys

import pytest

from schedkit.cli.workload_args import progress_bar, progress_display


def options(**given: bool) -> argparse.Namespace:
    return argparse.Namespace(**{"json": False, "no_progress": False, **given})


def test_the_bar_shows_on_a_terminal_and_its_line_is_ended(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with progress_display(options(), 4) as show:
        assert show is not None
        show(4, 1.5)
    err = capsys.readouterr().err
    assert err.startswith("\r[" + "#" * 30 + "] 4/4 requests")
    assert err.endswith("\n")


@pytest.mark.parametrize("given", [{"json": True}, {"no_progress": True}, {}])
def test_no_bar_for_json_no_progress_or_no_terminal(monkeypatch, capsys, given):
    terminal = bool(given)  # --json and --no-progress hide the bar even on a terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    with progress_display(options(**given), 4) as show:
        assert show is None
    assert capsys.readouterr().err == ""


def test_an_empty_run_draws_an_empty_bar(capsys):
    progress_bar(0)(0, 0.0)
    assert "[" + "." * 30 + "] 0/0 requests" in capsys.readouterr().err
