import subprocess
import sys
from pathlib import Path

import yaml

from schedkit.cli import main
from tests.schedkit.assembly.test_validate import EXPECTED, MISTAKES

GOOD = """\
plugins: [tests.schedkit.sample_components]
components:
  counter:
    type: sample_counter
    args: {start: 2}
  reader:
    type: sample_reader
    args:
      get_value: !late counter.value
      counter: !ref counter
"""


def test_validate_prints_a_table_and_exits_0(write, capsys):
    assert main(["validate", str(write("w.yaml", GOOD))]) == 0
    out = capsys.readouterr().out
    assert "counter    sample_counter  -             -" in out
    assert "reader     sample_reader   counter       counter.value" in out
    assert "2 components, wiring is valid" in out


def test_validate_reports_every_mistake_and_exits_2(write, capsys, monkeypatch):
    monkeypatch.delenv("SK_UNSET_FOR_TEST", raising=False)
    path = write("bad.yaml", MISTAKES)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{len(EXPECTED)} problem(s)" in err
    for line, text in EXPECTED:
        assert f"{path}:{line}: {text}" in err


def test_command_exits_2_without_traceback(write):
    path = write("bad.yaml", MISTAKES)
    overlay = write("syntax.yaml", "components:\n  a: [\n")
    result = subprocess.run(
        [sys.executable, "-m", "schedkit.cli", "validate", str(path), "-o", str(overlay)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[3],
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{overlay}:3: YAML syntax error" in result.stderr
    assert f"{path}:22: components.plain.type" in result.stderr


def test_graph_mermaid_and_dot_draw_late_edges_dashed(write, capsys):
    path = str(write("w.yaml", GOOD))
    assert main(["graph", path]) == 0
    out = capsys.readouterr().out
    assert "reader -.->|value| counter" in out and "reader -->|ref| counter" in out
    assert main(["graph", path, "--format", "dot"]) == 0
    out = capsys.readouterr().out
    assert 'reader -> counter [style=dashed, label="value"];' in out
    assert 'reader -> counter [style=solid, label="ref"];' in out


def test_config_resolved_lists_every_field_with_defaults(write, capsys):
    path = write("w.yaml", GOOD)
    overlay = write("o.yaml", "components:\n  counter:\n    args: {step: 0.5}\n")
    assert main(["config", str(path), "-o", str(overlay), "--resolved"]) == 0
    data = yaml.load(capsys.readouterr().out, Loader=_RefLoader)
    assert data["components"]["counter"] == {
        "type": "sample_counter",
        "args": {"start": 2, "step": 0.5, "tags": []},
    }
    assert data["components"]["reader"]["args"] == {
        "get_value": "!late counter.value",
        "bump": None,
        "counter": "!ref counter",
        "peer": None,
        "anything": None,
        "name": "reader",
    }


class _RefLoader(yaml.SafeLoader):
    pass


for _tag in ("!ref", "!late", "!call"):
    _RefLoader.add_constructor(_tag, lambda loader, node, t=_tag: f"{t} {node.value}")


def test_init_example_writes_the_overlay_under_its_own_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "--example", "swa"]) == 0
    assert not (tmp_path / "wiring.yaml").exists()
    assert "swa_radix_cache" in (tmp_path / "swa.yaml").read_text()
    assert "schedkit run wiring.yaml -o swa.yaml" in capsys.readouterr().err
    assert main(["init"]) == 0
    assert main(["validate", "wiring.yaml", "-o", "swa.yaml"]) == 0


def test_a_shipped_overlay_is_taken_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no serve.yaml here: the shipped one
    assert main(["config", "-o", "serve", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "type: zmq_server  # " in out and "schedkit/wirings/serve.yaml" in out
