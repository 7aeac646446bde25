import pytest

from schedkit import Ref, WiringError, late, load_wiring, ref
from schedkit.assembly.yaml_reader import read_wiring

BASE = """\
plugins: [tests.schedkit.sample_components]
components:
  counter:
    type: sample_counter
    args:
      start: 3
      step: 2.5
  reader:
    type: sample_reader
    args:
      get_value: !late counter.value
      counter: !ref counter
      name: base
"""


def test_loads_types_args_refs_and_lines(write):
    wiring = load_wiring(write("w.yaml", BASE))
    reader = wiring.components["reader"]
    assert reader.type == "sample_reader"
    assert reader.args["get_value"] == Ref("late", "counter", ("value",), reader.file, 11)
    assert reader.args["counter"].eager
    assert reader.where() == f"{reader.file}:8"
    assert reader.where("counter") == f"{reader.file}:12"
    assert reader.where("type") == f"{reader.file}:9"
    assert wiring.components["counter"].args == {"start": 3, "step": 2.5}


def test_overlay_replaces_type_merges_args_removes_with_null_and_adds(write):
    base = write("w.yaml", BASE)
    overlay = write(
        "o.yaml",
        """\
components:
  counter:
    args:
      start: 10
      step: null
  reader:
    type: sample_reader
    args:
      name: overlaid
  extra:
    type: sample_counter
""",
    )
    wiring = load_wiring(base, overlay)
    assert wiring.components["counter"].args == {"start": 10}
    assert wiring.components["counter"].where("start") == f"{overlay}:4"
    assert wiring.components["reader"].args["name"] == "overlaid"
    assert wiring.components["reader"].args["counter"] == Ref("ref", "counter", (), str(base), 12)
    assert list(wiring.components) == ["counter", "reader", "extra"]


def test_overlay_null_entry_removes_a_component(write):
    base = write("w.yaml", BASE + "  extra:\n    type: sample_counter\n")
    wiring = load_wiring(base, write("o.yaml", "components:\n  extra: null\n"))
    assert "extra" not in wiring.components


def test_mapping_sources_and_python_refs():
    wiring = load_wiring(
        {
            "plugins": ["tests.schedkit.sample_components"],
            "components": {
                "counter": {"type": "sample_counter"},
                "reader": {
                    "type": "sample_reader",
                    "args": {"get_value": late("counter.value"), "counter": ref("counter")},
                },
            },
        },
        {"components": {"counter": {"args": {"start": 7}}}},
        {"components": {"counter": {"args": {"step": 2}}, "reader": {"args": {"counter": None}}}},
    )
    assert wiring.components["counter"].args == {"start": 7, "step": 2.0}
    assert "counter" not in wiring.components["reader"].args  # an overlay's null removes it
    assert wiring.components["reader"].args["get_value"].target == "counter"


def test_environment_interpolation(write, monkeypatch):
    monkeypatch.setenv("SK_START", "41")
    monkeypatch.delenv("SK_NAME", raising=False)
    wiring = load_wiring(
        write(
            "w.yaml",
            BASE.replace("start: 3", "start: ${SK_START}").replace(
                "name: base", "name: n-${SK_NAME:-anon}-$${literal}"
            ),
        )
    )
    assert wiring.components["counter"].args["start"] == 41
    assert wiring.components["reader"].args["name"] == "n-anon-${literal}"
    assert type(wiring.components["reader"].args["name"]) is str


def test_unset_environment_variable_without_default_is_an_error(write, monkeypatch):
    monkeypatch.delenv("SK_MISSING", raising=False)
    path = write("w.yaml", BASE.replace("start: 3", "start: ${SK_MISSING}"))
    with pytest.raises(WiringError) as info:
        load_wiring(path)
    assert info.value.errors == [
        f"{path}:6: components.counter.args.start: environment variable SK_MISSING is not set "
        "and has no default; set it or write ${SK_MISSING:-default}"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("components:\n  a: [\n", ":3: YAML syntax error"),
        ("- just\n- a list\n", ":1: a wiring file is a mapping"),
        (
            "compnents: {}\n",
            ":1: compnents: unknown top-level key; valid keys: plugins, components",
        ),
        ("components:\n  a:\n    typ: x\n", ":3: components.a.typ: unknown key; valid keys: type"),
        ("components:\n  a:\n    args: {x: 1}\n", ":2: components.a: no 'type' given"),
        ("components:\n  a-b:\n    type: x\n", ":2: components.a-b: a component name is"),
        ("components:\n  a:\n    type: x\n    args: {y: !ref 'b c'}\n", ":4: components.a.args.y:"),
        ("components:\n  a:\n    type: x\n    args: {y: !call b}\n", "names no method"),
        ("components:\n  a:\n    type: x\n    args: {y: !env b}\n", "unknown tag !env"),
    ],
)
def test_structural_errors_name_file_and_line(write, text, expected):
    path = write("w.yaml", text)
    errors: list[str] = []
    read_wiring(path, errors=errors)
    assert any(e.startswith(str(path)) and expected in e for e in errors), errors


def test_missing_file_is_reported(tmp_path):
    with pytest.raises(WiringError) as info:
        load_wiring(tmp_path / "absent.yaml")
    assert "absent.yaml: cannot read wiring file" in str(info.value)


def test_null_sets_none_in_the_base_and_in_a_component_an_overlay_adds(write):
    base = write("w.yaml", BASE.replace("      counter: !ref counter\n", "      counter: null\n"))
    overlay = write(
        "o.yaml",
        "components:\n  extra:\n    type: sample_reader\n"
        "    args: {get_value: !late counter.value, counter: null}\n",
    )
    wiring = load_wiring(base, overlay)
    assert wiring.components["reader"].args["counter"] is None
    assert wiring.components["extra"].args["counter"] is None
