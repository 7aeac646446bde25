"""Repository-level checks: the README's commands match CI, and the code is ruff clean."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```sh")
    end = lines.index("```", start)
    return [line for line in lines[start + 1 : end] if line and not line.startswith("#")]


def test_readme_opens_with_the_two_fresh_machine_commands():
    run, test = _readme_commands()
    assert run.endswith("schedkit run wiring.yaml")
    assert "pytest" in test
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[-1] == test, "the last line of .ci/run must be the README's test command"


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]])
def test_ruff_clean(args):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
