"""Hostile trace files, one bad line each, through ``schedkit run --workload``: each gives one
located problem and exit 2, never a traceback, in bounded memory (measured in the child)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from schedkit.cli import main

DEEP = "[" * 1000 + "]" * 1000
MEMORY_MIB = 150  # schedkit run itself takes ~60 MiB before it reads anything


@pytest.fixture(autouse=True)
def default_logging():
    """``main`` points structlog at the sys.stderr of its time: restore the defaults."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


_CASES_SCRIPT = """
import contextlib, io, json, sys
from schedkit.cli import main
from schedkit.testing.serving import peak_rss_mib
import os
for path, fmt in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(["run", "--workload", path, "--format", fmt, "--no-progress"])
    print(json.dumps([status, err.getvalue(), peak_rss_mib(os.getpid())]), flush=True)
"""


def run_in_child(cases: list[tuple[str, str]]) -> list[tuple[int, str, float]]:
    """``schedkit run --workload path --format fmt`` for each case, one after the other in one
    child process: exit status, stderr and the child's peak RSS so far (MiB), per case."""
    out = subprocess.run(
        [sys.executable, "-c", _CASES_SCRIPT, json.dumps(cases)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [tuple(json.loads(line)) for line in out.splitlines()]


def run_here(path: Path | str, fmt: str, capsys) -> tuple[int, str]:
    """``schedkit run --workload path --format fmt`` in this process: status, stderr."""
    status = main(["run", "--workload", str(path), "--format", fmt, "--no-progress"])
    return status, capsys.readouterr().err


def located(stderr: str, where: str) -> str:
    """The one problem line, which must start with ``where``."""
    lines = stderr.splitlines()
    assert "Traceback" not in stderr, stderr
    assert lines[0] == "schedkit run: 1 problem(s) in the workload:", stderr
    assert len(lines) == 2 and lines[1].startswith(f"  {where}"), stderr
    return lines[1]


def mooncake(ts: float, extra: str = "") -> str:
    return f'{{"timestamp": {ts}, "input_length": 4, "output_length": 2, "hash_ids": [1]{extra}}}\n'


@pytest.mark.parametrize("fmt", ["mooncake", "sharegpt"])
def test_an_unknown_field_nested_1000_deep(default_recursion_limit, tmp_path, capsys, fmt):
    if fmt == "mooncake":
        path = tmp_path / "t.jsonl"
        path.write_text(mooncake(0) + mooncake(1, f', "x": {DEEP}'))
    else:
        path = tmp_path / "t.json"
        turns = '[{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]'
        path.write_text(f'[{{"conversations": {turns}}},\n{{"x": {DEEP}, "conversations": []}}]')
    status, err = run_here(path, fmt, capsys)
    assert status == 2 and "nested too deep" in located(err, f"{path}:2:")


@pytest.mark.parametrize(
    ("fmt", "header", "row"),
    [
        ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46,{},4"),
        ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46,4,{}"),
        ("burstgpt", "Timestamp,Model,Request tokens,Response tokens", "5,m,{},4"),
    ],
)
@pytest.mark.parametrize("count", [10**9, 10**10])
def test_token_counts_of_1e9_and_1e10(tmp_path, capsys, fmt, header, row, count):
    path = tmp_path / "t.csv"
    path.write_text(f"{header}\n{row.format(count)}\n")
    status, err = run_here(path, fmt, capsys)
    problem = located(err, f"{path}:2:")
    assert status == 2 and f"{count} is over the 1048576 tokens a request may have" in problem


def test_a_header_naming_a_column_twice(tmp_path, capsys):
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,9,4\n"
    )
    status, err = run_here(path, "azure", capsys)
    assert status == 2 and "names ContextTokens more than once" in located(err, f"{path}:1:")


def test_a_block_size_over_a_request_is_refused_before_it_is_allocated(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(mooncake(0))
    argv = ["run", "--workload", str(path), "--format", "mooncake", "--no-progress"]
    assert main([*argv, "--trace-block-size", str(10**11)]) == 2
    err = capsys.readouterr().err
    assert "block_size must be a whole number in [1, 1048576]" in err and "Traceback" not in err


def test_a_burstgpt_timestamp_of_1e300(tmp_path, capsys):
    path = tmp_path / "t.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens\n0,m,4,4\n1e300,m,4,4\n")
    status, err = run_here(path, "burstgpt", capsys)
    assert status == 2 and "more than the 1e+08 s a trace may span" in located(err, f"{path}:3:")


def test_invalid_utf8_is_reported_with_its_line(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"prompt_len": 4}\n{"prompt_len": 4, "rid": "\xff\xfe"}\n')
    status, err = run_here(path, "jsonl", capsys)
    assert status == 2 and "not UTF-8 text" in located(err, f"{path}:2:")


def test_files_that_would_take_memory_are_refused_in_bounded_memory(tmp_path):
    csv_field = tmp_path / "field.csv"
    row = '2023-11-16 18:15:46.6805900,10,"' + "x" * 200_000 + '"\n'
    csv_field.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + row)
    prompt_len = tmp_path / "prompt_len.jsonl"
    prompt_len.write_text('{"prompt_len": 4}\n{"prompt_len": 10000000000}\n')
    long_line = tmp_path / "long_line.jsonl"
    with open(long_line, "wb") as f:
        f.write(mooncake(0).encode() + b'{"timestamp": 1, "x": "')
        f.truncate(500_000_000)  # sparse: a 500 MB line, cheap to make
        f.seek(0, 2)
        f.write(b'"}\n' + mooncake(2).encode())
    reverse = tmp_path / "reverse.jsonl"
    reverse.write_text(
        "".join(f'{{"prompt_len": 4, "arrival": {20_000 - i}}}\n' for i in range(20_000))
    )
    assert 0.5e6 < reverse.stat().st_size < 1.1e6
    cases = [
        (csv_field, "azure", f"{csv_field}:2: not CSV: field larger than field limit (131072)"),
        (prompt_len, "jsonl", f"{prompt_len}:2: the prompt has 10000000000 tokens, over the"),
        ("/dev/zero", "jsonl", "/dev/zero: not a regular file (a device or a pipe)"),
        (long_line, "mooncake", f"{long_line}:2: a line of more than 16777216 bytes (not read)"),
        (reverse, "jsonl", f"{reverse}:4098: arrives at 15903.000 s, before line 4097 at"),
    ]
    results = run_in_child([(str(path), fmt) for path, fmt, _ in cases])
    print([round(peak, 1) for _, _, peak in results])
    for (_, _, problem), (status, err, peak) in zip(cases, results, strict=True):
        assert status == 2 and problem in located(err, problem), err
        assert peak < MEMORY_MIB, (problem, peak)
    assert "(and 15902 more lines like it" in results[-1][1]
