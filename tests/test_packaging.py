"""The wheel: it ships the default wiring and the examples' overlays as package data (the same
bytes as the documented files), and an installed wheel runs with no wiring file at hand."""

import json
import os
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from schedkit import wirings
from schedkit.testing.serving import free_endpoint

ROOT = Path(__file__).resolve().parents[1]
# each shipped wiring, as the wheel names it, and the documented file it links to
SHIPPED = {
    f"schedkit/wirings/{name}.yaml": wirings.path(name).resolve() for name in wirings.names()
}


def test_the_shipped_wirings_are_links_to_the_documented_files():
    assert {"wiring", "serve", "swa"} <= set(wirings.names())
    assert SHIPPED["schedkit/wirings/wiring.yaml"] == ROOT / "wiring.yaml"
    assert SHIPPED["schedkit/wirings/swa.yaml"] == ROOT / "examples" / "swa.yaml"
    for name, documented in SHIPPED.items():
        assert (ROOT / name).is_symlink(), f"{name} must be a link, not a second copy"
        assert documented.parent in (ROOT, ROOT / "examples"), documented
    with pytest.raises(ValueError, match=r"no shipped wiring .nope.; valid names: .*serve, swa"):
        wirings.path("nope")


def test_the_wheel_holds_the_wirings(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for name, documented in SHIPPED.items():
            assert name in names
            assert archive.read(name) == documented.read_bytes()
    assert "schedkit/components/scheduler/scheduler.py" in names
    assert "schedkit/runner/presets.py" in names


def test_an_installed_wheel_runs_without_a_wiring_file(installed_wheel, tmp_path):
    venv = installed_wheel
    python = venv / "bin" / "python"
    env = {
        **os.environ,
        "SCHEDKIT_KV_EVENTS_ENDPOINT": free_endpoint(),
        "SCHEDKIT_KV_REPLAY_ENDPOINT": free_endpoint(),
    }
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    result = subprocess.run(
        [str(venv / "bin" / "schedkit"), "run", "--num-requests", "20", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["requests_done"] == 20
    assert time.monotonic() - started < 30
    where = subprocess.run(
        [str(python), "-c", "import schedkit.wirings as w; print(w.path())"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(venv)) and not Path(where).is_symlink()
