"""``schedkit run --workload FILE --format ...``: a trace through the default scheduler, and
the errors a user sees for a bad trace or options that do not apply."""

from __future__ import annotations

import json
import subprocess

from tests.schedkit.sim.test_driver import run as start_run


def run(*args: str) -> subprocess.CompletedProcess:
    proc = start_run(*args)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_the_mooncake_sample_runs_with_prefix_cache_hits():
    sample = "examples/traces/mooncake_sample.jsonl"
    result = run("--workload", sample, "--format", "mooncake", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["requests_done"] == 300 and summary["requests_failed"] == 0
    assert summary["prefix_cache_hit_rate"] > 0.2
    # The trace spans ~70 s; ten times faster it ends sooner.
    fast = json.loads(
        run(
            "--workload",
            sample,
            "--format",
            "mooncake",
            "--json",
            "--speedup",
            "10",
            "--num-requests",
            "100",
        ).stdout
    )
    assert fast["requests_done"] == 100
    assert fast["simulated_s"] < summary["simulated_s"] / 5


def test_a_bad_trace_is_listed_without_a_traceback(tmp_path):
    path = tmp_path / "trace.jsonl"
    good = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
    path.write_text(good + '{"timestamp": 1, "input_length": 10}\n' * 500)
    result = run("--workload", str(path), "--format", "mooncake")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "schedkit run: 1 problem(s) in the workload:"
    assert lines[1].startswith(f"  {path}:2: Object missing required field `output_length`")
    assert lines[1].endswith("(and 499 more lines like it: 3, 4, 5, 6, 7, ...)")
    assert "Traceback" not in result.stderr


def test_options_that_do_not_apply_are_refused(tmp_path):
    result = run("--speedup", "2")
    assert result.returncode == 2 and "--speedup apply to --workload only" in result.stderr
    (tmp_path / "u.csv").write_text("time,tokens\n1,2\n")
    result = run("--workload", str(tmp_path / "u.csv"))
    assert result.returncode == 2 and "say which with --format" in result.stderr
    (tmp_path / "t.csv").write_text("Timestamp,Request tokens,Response tokens\n1,2,3\n")
    result = run("--workload", str(tmp_path / "t.csv"))  # a BurstGPT header: taken as one
    assert result.returncode == 0
    assert "read as burstgpt, by its header; give --format to say otherwise" in result.stderr
    result = run("--workload", str(tmp_path / "t.csv"), "--format", "burstgpt", "--rate", "3")
    assert result.returncode == 2 and "own timestamps" in result.stderr
    assert "Traceback" not in result.stderr
