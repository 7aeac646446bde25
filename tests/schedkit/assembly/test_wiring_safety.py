"""Hostile and broken wiring files: each is refused quickly, as FILE:LINE with exit status 2,
never with a traceback, and without importing anything that is not a plugin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from schedkit import WiringError, load_wiring
from schedkit.cli import main
from tests.schedkit.assembly.test_yaml_values import BILLION_LAUGHS

ROOT = Path(__file__).resolve().parents[3]


def problems(path: Path) -> list[str]:
    with pytest.raises(WiringError) as exc:
        load_wiring(path)
    return exc.value.errors


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("components:\n  !ref a: {type: parallel_state}\n", 2, "a key must be a plain name"),
        ("components:\n  ? [a, b]\n  : {type: parallel_state}\n", 2, "got a list"),
        (
            "components:\n  a:\n    type: parallel_state\n    args:\n"
            "      x: !!python/object/apply:os.system ['true']\n",
            5,
            "unknown tag tag:yaml.org,2002:python/object/apply:os.system",
        ),
        (
            "components:\n  a:\n    type: parallel_state\n  a:\n    type: scheduler\n",
            4,
            "components.a: duplicate key (first given at line 2)",
        ),
        (
            "components:\n  a:\n    type: parallel_state\n    args:\n      tp_size: 2\n"
            "      tp_size: 4\n",
            6,
            "components.a.args.tp_size: duplicate key (first given at line 5)",
        ),
        (
            "components:\n  a:\n    type: parallel_state\n    type: scheduler\n",
            4,
            "components.a.type: duplicate key",
        ),
        ("components: {}\ncomponents: {}\n", 2, "components: duplicate key"),
        ("components:\n  providers:\n    type: parallel_state\n", 2, "reserved by the container"),
        ("components:\n  _hidden:\n    type: parallel_state\n", 2, "underscore"),
        # Tags on mappings were read as plain ones: !!set gave a wiring of no components.
        ("components: !!set {a, b}\n", 1, "components: unknown tag tag:yaml.org,2002:set"),
        ("components:\n  a: !ref {type: parallel_state}\n", 2, "components.a: unknown tag !ref"),
        ("components:\n  a:\n", 2, "components.a: an empty entry"),
        (
            "components:\n  a:\n    type: token_to_kv_pool_allocator\n"
            "    args: {size: !ref b.free.__globals__}\n",
            4,
            "'__globals__' is private (it starts with an underscore)",
        ),
        ("plugins: [.evil]\ncomponents: {}\n", 1, "a plugin is an absolute module name"),
    ],
)
def test_structural_mistakes_name_file_and_line(tmp_path, text, line, problem):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    errors = problems(path)
    assert any(e.startswith(f"{path}:{line}:") and problem in e for e in errors), errors


def test_a_type_naming_a_module_that_is_no_plugin_imports_nothing(tmp_path):
    module = tmp_path / "evil_module_for_wiring_test.py"
    module.write_text("import pathlib\npathlib.Path(__file__).with_suffix('.ran').touch()\n")
    path = tmp_path / "w.yaml"
    path.write_text("components:\n  a:\n    type: evil_module_for_wiring_test:Thing\n")
    sys.path.insert(0, str(tmp_path))
    try:
        (error,) = problems(path)
    finally:
        sys.path.remove(str(tmp_path))
    assert error.startswith(f"{path}:3: components.a.type: module 'evil_module_for_wiring_test'")
    assert "list it under 'plugins:'" in error
    assert "evil_module_for_wiring_test" not in sys.modules
    assert not module.with_suffix(".ran").exists()


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (
            "token_to_kv_pool_allocator\n    args: {size: 64, page_size: 0}",
            "components.a.args.page_size: page_size must be an integer >= 1, got 0",
        ),
        (
            "token_to_kv_pool_allocator\n    args: {size: -5}",
            "components.a.args.size: size must be an integer >= 0, got -5",
        ),
        (
            "output_streamer\n    args: {stream_interval: 0}",
            "components.a.args.stream_interval: stream_interval must be an integer >= 1",
        ),
        (
            "radix_cache\n    args: {capacity: 8, eviction_policy: mru}",
            "components.a.args.eviction_policy: unknown eviction_policy 'mru'; valid: lru",
        ),
    ],
)
def test_range_errors_are_found_by_validate(tmp_path, entry, problem):
    path = tmp_path / "w.yaml"
    path.write_text(f"components:\n  a:\n    type: {entry}\n")
    errors = problems(path)
    assert any(e.startswith(f"{path}:4: ") and problem in e for e in errors), errors


def test_every_bad_file_exits_2_without_traceback(tmp_path):
    files = {
        "laughs.yaml": BILLION_LAUGHS.encode(),
        "deep.yaml": b"components: " + b"[" * 5000 + b"]" * 5000,
        "latin1.yaml": b"components:\n  a: {type: caf\xe9}\n",
        "tagged.yaml": b"components:\n  !ref a: {type: parallel_state}\n",
    }
    started = {}
    for name, content in files.items():  # the four validations run side by side
        path = tmp_path / name
        path.write_bytes(content)
        started[name] = subprocess.Popen(
            [sys.executable, "-m", "schedkit.cli", "validate", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for name, process in started.items():
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 2, (name, stderr)
        assert "Traceback" not in stderr and f"{tmp_path / name}" in stderr, name


@pytest.mark.parametrize("overlays", [[], ["examples/serve.yaml"]])
def test_config_resolved_is_a_wiring_that_loads_again(tmp_path, capsys, overlays):
    args = ["config", str(ROOT / "wiring.yaml"), "--resolved"]
    for overlay in overlays:
        args += ["-o", str(ROOT / overlay)]
    assert main(args) == 0
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(capsys.readouterr().out)
    original = load_wiring(ROOT / "wiring.yaml", *[ROOT / o for o in overlays])
    again = load_wiring(resolved)
    assert {n: s.type for n, s in again.components.items()} == {
        n: s.type for n, s in original.components.items()
    }


def test_schedkit_run_takes_the_resolved_default_wiring(tmp_path, capsys):
    assert main(["config", str(ROOT / "wiring.yaml"), "--resolved"]) == 0
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(capsys.readouterr().out)
    result = subprocess.run(
        [sys.executable, "-m", "schedkit.cli", "run", str(resolved), "--num-requests", "5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "requests done / failed" in result.stdout
