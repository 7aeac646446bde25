"""Every command's and script's --help describes it in whole sentences."""

import subprocess
import sys
from pathlib import Path

import pytest

from schedkit.cli import _parser

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = [
    "examples/send_requests.py",
    "examples/kv_router/router.py",
    "benchmarks/bench_fleet.py",
    "benchmarks/bench_kv_events.py",
    "benchmarks/bench_overload.py",
    "benchmarks/bench_scheduler.py",
    "benchmarks/bench_serve_hostile.py",
]


def _ends_a_sentence(text: str) -> bool:
    return text.rstrip().endswith((".", ")", ":"))


def test_the_schedkit_description_is_a_whole_sentence():
    parser = _parser()
    assert _ends_a_sentence(parser.description)
    assert "``" not in parser.description


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_help_ends_with_a_whole_sentence(script):
    result = subprocess.run(
        [sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    description = result.stdout.split("\n\n")[1]
    assert _ends_a_sentence(description), description
