"""Reading a JSON array (a ShareGPT trace) an item at a time."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from schedkit.workloads.json_array import iter_json_array
from schedkit.workloads.trace_io import ProblemLog


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_json_array_items_with_brackets_and_quotes_in_strings(tmp_path, chunk):
    items = [
        {"conversations": [{"from": "human", "value": 'a "[{" \\ ]} \u00e9\n' * i}]}
        for i in range(12)
    ]
    path = tmp_path / "t.json"
    text = json.dumps(items, indent=1)
    path.write_text(text)
    log = ProblemLog(path)
    read = list(iter_json_array(path, log, chunk=chunk))
    assert not log and [json.loads(item) for _, item in read] == items
    starts = [n + 1 for n, line in enumerate(text.splitlines()) if line == " {"]
    assert [line for line, _ in read] == starts


def test_json_array_problems_name_their_line(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('[\n{"a": 1},\n"text",\n{"b": 2}\n{"c": 3},\n4\n]\n')
    log = ProblemLog(path)
    assert [line for line, _ in iter_json_array(path, log, chunk=5)] == [2, 4, 5]
    assert log.errors() == [
        f"{path}:3: expected an object, got a string",
        f"{path}:5: expected ',' between items, got ''",
        f"{path}:7: expected an object, got '4'",
    ]
    path.write_text('{"conversations": []}')
    log = ProblemLog(path)
    assert list(iter_json_array(path, log)) == []
    assert log.errors() == [f"{path}:1: expected a JSON array of conversations ([{{...}}, ...])"]
    path.write_text('[{"a": "cut short')
    log = ProblemLog(path)
    assert list(iter_json_array(path, log)) == []
    assert "cut short" in log.errors()[0]


@pytest.mark.parametrize("chunk", [3, 1 << 20])
def test_a_comma_after_the_last_item_or_text_after_the_array_is_a_problem(tmp_path, chunk):
    path = tmp_path / "t.json"
    path.write_text('[{"a": 1},\n]\n  \n\n[{"b": 2}]\n')
    log = ProblemLog(path)
    assert [line for line, _ in iter_json_array(path, log, chunk=chunk)] == [1]
    assert log.errors()[0] == f"{path}:2: a ',' after the last item (JSON allows none)"
    assert log.errors()[1].startswith(f"{path}:5: text after the array's closing ]: '[")
    path.write_text('[{"a": 1}]  \n\n')  # white space may follow
    log = ProblemLog(path)
    assert len(list(iter_json_array(path, log, chunk=chunk))) == 1 and not log


def test_json_array_holds_one_chunk_not_the_file(tmp_path):
    path = tmp_path / "big.json"
    item = {"conversations": [{"from": "human", "value": "q" * 200}, {"from": "gpt", "value": "a"}]}
    path.write_text(json.dumps([item] * 5_000))  # 1.2 MB
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_json_array(path, ProblemLog(path), chunk=1 << 16))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 5_000
    assert peak < 2**19, f"peak {peak / 2**20:.2f} MiB"
