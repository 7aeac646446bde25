"""The streaming readers under the trace formats, and the brief problem report."""

from __future__ import annotations

import pytest

from schedkit.workloads.trace_io import ProblemLog, iter_csv_rows, iter_lines
from schedkit.workloads.workload import WorkloadError


def test_problems_are_grouped_by_kind_with_their_first_line():
    log = ProblemLog("t.jsonl")
    for line in range(1, 11):
        log.add(line, f"'input_length' must be >= 1, got -{line}")
    log.add(11, "rid 'a' is used twice", kind="rid")
    log.add(12, "rid 'b' is used twice", kind="rid")
    log.skip(13, "0 output tokens")
    log.skip(14, "0 output tokens")
    assert log.errors() == [
        "t.jsonl:1: 'input_length' must be >= 1, got -1 (and 9 more lines like it: "
        "2, 3, 4, 5, 6, ...)",
        "t.jsonl:11: rid 'a' is used twice (and 1 more line like it: 12)",
    ]
    assert log.notes() == ["t.jsonl: skipped 2 records (0 output tokens), the first at line 13"]
    with pytest.raises(WorkloadError) as info:
        log.raise_if_any()
    assert info.value.errors == log.errors()


def test_at_most_twenty_kinds_are_shown():
    log = ProblemLog("t.csv")
    for line in range(30):
        log.add(line, f"problem {line}", kind=str(line))
    errors = log.errors()
    assert len(errors) == 21 and errors[-1] == "t.csv: 10 more kinds of problem not shown"


def test_lines_skip_blanks_and_comments(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"# header\n\n  {}  \r\n")
    log = ProblemLog(path)
    assert list(iter_lines(path, log)) == [(3, b"{}")]
    assert not log


def test_csv_rows_take_columns_by_name(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('b,a,c\n1,2,3\n\n"4,4",5,6\n7,8\n')
    log = ProblemLog(path)
    assert list(iter_csv_rows(path, ("a", "b"), log)) == [(2, ["2", "1"]), (4, ["5", "4,4"])]
    assert log.errors() == [f"{path}:5: 2 values where the header has 3"]
