"""A new user's first hour (docs/first-hour.md), done from the page alone, outside the
checkout, with the built wheel installed in a fresh virtual environment.

Every block of the page is a step, in order: a block whose first line is ``# file: PATH`` is
written to PATH; a ``sh`` block runs. The one step not taken literally is ``pip install
schedkit``: the wheel built from this tree is installed instead (nothing leaves the machine).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.docs.test_blocks import blocks

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "first-hour.md"
INSTALL = "pip install schedkit"
END = "SCHEDKIT_FIRST_HOUR_FILE_END"


def script() -> tuple[str, list[str]]:
    """The page as one bash script, and what each block was (file or step)."""
    lines, done = ["set -euo pipefail"], []
    for block in blocks(PAGE):
        first = block.text.splitlines()[0]
        if first.startswith("# file: "):
            path = first.removeprefix("# file: ").strip()
            body = block.text.split("\n", 1)[1]
            lines += [
                f"mkdir -p \"$(dirname '{path}')\"",
                f"cat > '{path}' <<'{END}'",
                body.rstrip("\n"),
                END,
            ]
            done.append(f"file {path}")
        elif block.lang == "sh":
            text = block.text.replace(INSTALL, ": installed from the wheel already")
            lines += [f"echo '>>> step at {block.where}'", text]
            done.append(f"step {block.where}")
        else:
            raise AssertionError(f"{block.where}: a block that is neither a file nor a step")
    return "\n".join(lines) + "\n", done


def test_the_first_hour_from_the_docs_alone(installed_wheel, tmp_path):
    bash, done = script()
    assert INSTALL in PAGE.read_text()
    assert sum(d.startswith("file") for d in done) == 6  # package, overlays, pyproject, tests
    venv = installed_wheel
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "SCHEDKIT_KV_EVENTS_ENDPOINT": "tcp://127.0.0.1:0",
        "SCHEDKIT_KV_REPLAY_ENDPOINT": "tcp://127.0.0.1:0",
        "HOME": str(home),
    }
    for name in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(name, None)
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "-c", bash], cwd=home, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    project = home / "my-scheduler"
    assert (project / "wiring.yaml").is_file() and (project / "before.json").is_file()
    assert "wiring is valid" in result.stdout
    assert "5 passed" in result.stdout  # the project's own tests, with the plugin
    assert "hit rate" in result.stdout
    # everything ran from the installed wheel, not from this checkout
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import schedkit; print(schedkit.__file__)"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(venv))
    assert time.monotonic() - started < 120
