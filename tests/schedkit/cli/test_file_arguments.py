"""Hostile file arguments: each is refused up front with one line and exit 2, never a
traceback, before the command reads or writes anything."""

from __future__ import annotations

import time

import pytest
import structlog

from schedkit.cli import main
from schedkit.runner.model_runner import SimulatedModelRunner
from tests.schedkit.runner.test_calibrate import measured_csv

HEADER = "mode,batch_size,new_tokens,attention_pairs,context_tokens,step_time_ms\n"


@pytest.fixture(autouse=True)
def default_logging():
    """``main`` points structlog at the sys.stderr of its time: restore the defaults."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


def one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    if lines[0].endswith("problem(s):"):
        lines = lines[1:]
    assert len(lines) == 1, err
    return lines[0].strip()


def test_init_refuses_a_dangling_link(tmp_path, capsys):
    link = tmp_path / "LINK"
    link.symlink_to(tmp_path / "elsewhere.yaml")
    assert main(["init", str(link)]) == 2
    assert "is a dangling symbolic link" in one_line(capsys, "init")
    assert not (tmp_path / "elsewhere.yaml").exists()


@pytest.mark.parametrize(
    ("target", "problem"),
    [("/dev/full", "is not a regular file"), ("{tmp}/no/such/dir/out.jsonl", "does not exist")],
)
def test_run_refuses_an_output_it_cannot_write_before_running(tmp_path, capsys, target, problem):
    target = target.format(tmp=tmp_path)
    assert main(["run", "--output", target, "--num-requests", "2", "--no-progress"]) == 2
    assert problem in one_line(capsys, "run")


@pytest.mark.parametrize(
    "command", [["validate", "/dev/zero"], ["run", "-o", "/dev/zero", "--num-requests", "2"]]
)
def test_a_device_as_a_wiring_file_is_refused(capsys, command):
    assert main(command) == 2
    assert "/dev/zero: not a regular file" in one_line(capsys, command[0])


def test_a_200_mb_wiring_of_one_comment_line_is_refused_by_its_size(tmp_path, capsys):
    path = tmp_path / "w.yaml"
    with open(path, "wb") as f:
        f.write(b"# " + b"x" * 1000)
        f.truncate(200_000_000)  # sparse: cheap to make
    start = time.perf_counter()
    assert main(["validate", str(path)]) == 2
    assert time.perf_counter() - start < 1.0
    assert "200000000 bytes, larger than a wiring may be (1048576)" in one_line(capsys, "validate")


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("decode,1,,,1" + "0" * 400 + ",7.0", "context_tokens: expected a whole number in [0,"),
        ("decode,1,,,500,1e308", "step_time_ms: expected milliseconds in (0, 3600000]"),
        ("decode,1,,,500," + "7" * 200_000, "a line of more than 4096 characters"),
    ],
)
def test_calibrate_reports_absurd_values_at_their_line(tmp_path, capsys, row, problem):
    steps = tmp_path / "steps.csv"
    steps.write_text(HEADER + "decode,1,,,500,7.0\n" + row + "\n")
    assert main(["calibrate", str(steps)]) == 2
    line = one_line(capsys, "calibrate")
    assert line.startswith(f"{steps}:3:") and problem in line and len(line) < 300


def test_calibrate_refuses_a_million_rows_at_the_first_past_its_bound(tmp_path, capsys):
    steps = tmp_path / "steps.csv"
    with open(steps, "w") as f:
        f.write(HEADER)
        f.writelines("decode,2,,,500,7.0\n" for _ in range(1_000_000))
    start = time.perf_counter()
    assert main(["calibrate", str(steps)]) == 2
    elapsed = time.perf_counter() - start
    line = one_line(capsys, "calibrate")
    assert line == f"{steps}:100002: more than 100000 steps; a fit needs a few hundred per mode"
    assert elapsed < 15, elapsed  # it stops there: the whole file took 16-34 s


def test_calibrate_write_never_overwrites_without_force(tmp_path, capsys):
    steps = tmp_path / "steps.csv"
    steps.write_text(measured_csv(SimulatedModelRunner(), rows=10, noise=0.0))
    written = tmp_path / "fitted.yaml"
    written.write_text("mine\n")
    assert main(["calibrate", str(steps), "--write", str(written)]) == 2
    assert (
        one_line(capsys, "calibrate")
        == f"schedkit calibrate: {written} exists; pass --force to overwrite it"
    )
    assert written.read_text() == "mine\n"
    assert main(["calibrate", str(steps), "--write", str(written), "--force"]) == 0
    assert "model_runner" in written.read_text()
