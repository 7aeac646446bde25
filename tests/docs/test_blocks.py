"""Every fenced block of the docs runs: README.md, docs/*.md and examples/*/README.md.

- ``python`` blocks are written to test files and run by pytest in one child process (module
  code runs when it is collected, test functions as tests), with the schedkit plugin and
  ``examples/swap_for_mock`` and ``examples/custom_policy`` importable;
- ``sh`` blocks run in bash (``set -euo pipefail``), one child process each;
- ``yaml`` blocks are read as wirings (syntax, tags, keys) and an overlay with components is
  validated over ``wiring.yaml``;
- an output block marked ``<!-- figures: NAME -->`` must be what ``python docs/figures.py
  NAME`` prints (wall-clock and memory figures masked).

All of them run in a scratch directory whose entries link to the repository's, so that a
block writing a file leaves the checkout alone; KV events go to free ports.
``<!-- docs-test: skip (REASON) -->`` right above a block keeps it from running (a server
that runs until stopped, a benchmark of minutes, set-up that CI runs itself), and
``<!-- docs-test: yaml-syntax -->`` has a YAML block read but not validated (a fragment that
is not a whole overlay). The markers are documented in docs/contributing.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[2]
# docs/first-hour.md is a sequence of steps: tests/test_first_hour.py runs them in order.
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "first-hour.md"),
    *sorted((ROOT / "examples").glob("*/README.md")),
]
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!-- (docs-test|figures): (.+?) -->$")
RUNNABLE = {"python", "sh", "yaml"}
KNOWN = {"", "python", "sh", "yaml", "ini", "toml", "text", "json", "mermaid", "table"}


@attrs.frozen
class Block:
    file: Path
    line: int
    lang: str
    text: str
    marker: tuple[str, str] | None

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    found, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        marker = MARKER.match(lines[i - 1]) if i else None
        if match is None and marker is not None and lines[i].startswith("|"):
            end = next(
                (j for j in range(i, len(lines)) if not lines[j].startswith("|")), len(lines)
            )
            found.append(
                Block(path, i + 1, "table", "\n".join(lines[i:end]) + "\n", marker.groups())
            )
            i = end
            continue
        if match is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == "```")
        marker = MARKER.match(lines[i - 1]) if i else None
        found.append(
            Block(
                path,
                i + 1,
                match.group(1),
                "\n".join(lines[i + 1 : end]) + "\n",
                marker.groups() if marker else None,
            )
        )
        i = end + 1
    return found


ALL = [b for path in DOCS for b in blocks(path)]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A directory whose entries link to the repository's, and the environment to run in."""
    where = tmp_path_factory.mktemp("docs")
    for entry in (
        "wiring.yaml",
        "examples",
        "docs",
        "benchmarks",
        "schedkit",
        "components",
        "pyproject.toml",
        "tests",
    ):
        (where / entry).symlink_to(ROOT / entry)
    env = {
        **os.environ,
        "SCHEDKIT_KV_EVENTS_ENDPOINT": "tcp://127.0.0.1:0",
        "SCHEDKIT_KV_REPLAY_ENDPOINT": "tcp://127.0.0.1:0",
        # the commands of the environment running the tests, activated or not
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
    }
    env.pop("PYTHONPATH", None)
    return where, env


def test_every_block_has_a_known_language_and_skips_say_why():
    for block in ALL:
        assert block.lang in KNOWN, f"{block.where}: unknown block language {block.lang!r}"
        if block.marker and block.marker[0] == "docs-test":
            kind = block.marker[1]
            assert re.fullmatch(r"skip \(.+\)|yaml-syntax", kind), f"{block.where}: {kind!r}"
        if block.marker and block.marker[0] == "figures":
            assert block.lang in ("", "table"), f"{block.where}: figures are output or tables"


def test_python_blocks_run(scratch, tmp_path):
    where, env = scratch
    runnable = [b for b in ALL if b.lang == "python" and b.marker is None]
    assert runnable
    names = {}
    for i, block in enumerate(runnable):
        name = f"test_doc_block_{i}.py"
        names[name] = block.where
        (tmp_path / name).write_text(f"# {block.where}\n{block.text}")
    env = {
        **env,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "examples/swap_for_mock"), str(ROOT / "examples/custom_policy")]
        ),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(where),
            str(tmp_path),
        ],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = result.stdout[-6000:]
    for name, place in names.items():
        report = report.replace(name, f"{name} ({place})")
    assert result.returncode == 0, report


@pytest.mark.parametrize(
    "block", [b for b in ALL if b.lang == "sh" and b.marker is None], ids=lambda b: b.where
)
def test_shell_blocks_run(scratch, block):
    where, env = scratch
    result = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{block.text}"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"{block.where}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "yaml"], ids=lambda b: b.where)
def test_yaml_blocks_read_and_validate(block, tmp_path):
    from schedkit import load_wiring
    from schedkit.assembly.yaml_reader import read_wiring

    if block.marker and block.marker[1].startswith("skip"):
        pytest.skip(block.marker[1])
    path = tmp_path / "block.yaml"
    path.write_text(block.text)
    errors: list[str] = []
    syntax_only = block.marker == ("docs-test", "yaml-syntax")
    if syntax_only:  # a fragment: read alone, its entries may lack a type
        if not block.text.startswith(("components:", "plugins:")):  # entries alone
            path.write_text("components:\n" + textwrap.indent(block.text, "  "))
        wiring = read_wiring(path, errors=errors)
        errors = [e for e in errors if "no 'type' given" not in e]
    else:
        wiring = read_wiring(ROOT / "wiring.yaml", path, errors=errors)
    assert errors == [], block.where
    if not syntax_only:
        sys.path[:0] = [str(ROOT / "examples/swap_for_mock"), str(ROOT / "examples/custom_policy")]
        try:
            load_wiring(ROOT / "wiring.yaml", path)
        finally:
            del sys.path[:2]
        assert wiring.components, block.where


_MASK = re.compile(r"\d[\d.,]*")


def _masked(text: str) -> list[str]:
    lines = []
    for line in text.strip().splitlines():
        if "wall" in line or "RSS" in line:
            name, _, value = line.partition("  ")
            figures = value.split("|")
            line = name + " | ".join(
                _MASK.sub("#", v) if "wall" in name and i else v.strip()
                for i, v in enumerate(figures)
            )
            if "RSS" in name:
                line = name + "#"
        lines.append(" ".join(line.split()))
    return lines


# Figures printed by the second of two docs/figures.py processes run side by side (one per
# core on a 2-core machine): about half of the CPU time of all figures, lpm-fcfs's in the other.
SECOND_PROCESS = {"custom-policy", "swa", "calibrate", "preset-run"}


def test_figures_are_what_the_script_prints(scratch):
    where, env = scratch
    marked = [b for b in ALL if b.marker and b.marker[0] == "figures"]
    assert marked
    names = sorted({b.marker[1] for b in marked})
    groups = [[n for n in names if n not in SECOND_PROCESS], sorted(SECOND_PROCESS & set(names))]
    processes = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "docs/figures.py"), *group],
            cwd=where,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for group in groups
        if group
    ]
    printed = {}
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=240)
            assert process.returncode == 0, stderr[-4000:]
            printed.update(
                (part.split("\n", 1)[0], part.split("\n", 1)[1]) for part in stdout.split("== ")[1:]
            )
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    for block in marked:
        assert _masked(block.text) == _masked(printed[block.marker[1]]), block.where
