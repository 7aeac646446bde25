from pathlib import Path

import pytest

from schedkit import WiringError, load_wiring
from tests.schedkit.sample_components import EVENTS

ROOT = Path(__file__).resolve().parents[3]

MISTAKES = """\
plugins: [tests.schedkit.sample_components]
components:
  counter:
    type: sample_countr
  good:
    type: sample_counter
    args:
      start: "three"
      stat: 4
      step: ${SK_UNSET_FOR_TEST}
  reader:
    type: sample_reader
    args:
      get_value: !late good.valu
      bump: 5
      counter: !ref nowhere
  reader2:
    type: sample_reader
    args:
      counter: !late good
  plain:
    type: tests.schedkit.sample_components:NotAComponent
  shell:
    type: os:system
  a:
    type: sample_reader
    args: {get_value: !late good.value, peer: !ref b}
  b:
    type: sample_reader
    args: {get_value: !late good.value, peer: !ref a}
"""

EXPECTED = [
    (4, "components.counter.type: unknown component type 'sample_countr'; did you mean"),
    (8, "components.good.args.start: invalid value 'three'"),
    (
        9,
        "components.good.args.stat: unknown argument of Counter; did you mean start? "
        "valid arguments: start, step, tags",
    ),
    (10, "components.good.args.step: environment variable SK_UNSET_FOR_TEST is not set"),
    (14, "components.reader.args.get_value: !late good.valu: Counter has no attribute 'valu'"),
    (15, "components.reader.args.bump: expects a callable"),
    (16, "components.reader.args.counter: !ref nowhere names no component"),
    (17, "components.reader2.args.get_value: missing required argument of Reader"),
    (20, "components.reader2.args.counter: !late good gives a callable, but the field is"),
    (
        22,
        "components.plain.type: tests.schedkit.sample_components:NotAComponent is not a "
        "component; only classes declared with @schedkit.core.component",
    ),
    (24, "components.shell.type: module 'os' is not a plugin of this wiring"),
    (25, "components.a: eager !ref cycle a -> b -> a; make one edge of it !late"),
]


def test_every_mistake_is_reported_at_once_with_file_line_and_key(write, monkeypatch):
    monkeypatch.delenv("SK_UNSET_FOR_TEST", raising=False)
    path = write("bad.yaml", MISTAKES)
    with pytest.raises(WiringError) as info:
        load_wiring(path)
    errors = info.value.errors
    for line, text in EXPECTED:
        assert any(e.startswith(f"{path}:{line}: {text}") for e in errors), (line, text, errors)
    assert len(errors) == len(EXPECTED), errors
    assert EVENTS == []  # nothing was constructed, not even the plain class


def test_eager_cycle_rejected_and_late_edge_builds_and_works(write, built):
    cycle = """\
plugins: [tests.schedkit.sample_components]
components:
  a:
    type: sample_reader
    args: {get_value: !late b.name, peer: !ref b}
  b:
    type: sample_reader
    args: {get_value: !late a.name, peer: !ref a}
"""
    with pytest.raises(WiringError) as info:
        load_wiring(write("cycle.yaml", cycle))
    assert "eager !ref cycle a -> b -> a" in str(info.value)

    fixed = cycle.replace("peer: !ref a}", "peer: !late a}")
    with pytest.raises(WiringError) as info:  # peer is not callable-typed: late is refused there
        load_wiring(write("fixed.yaml", fixed))
    assert "!late a gives a callable, but the field is Named | None" in str(info.value)

    fixed = cycle.replace("peer: !ref a}", "bump: !call a.get_value}")
    assembly = built(load_wiring(write("fixed.yaml", fixed)))
    assert assembly["a"].peer is assembly["b"]
    assert assembly["b"].bump() == "reader"  # b calls a.get_value(), which reads b.name late
    assembly["b"].name = "renamed"
    assert assembly["b"].bump() == "renamed"


def test_type_can_name_a_component_class_by_module_path(write, built):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\n"
        "components:\n  c:\n    type: tests.schedkit.sample_components:Counter\n"
        "    args: {start: 4}\n",
    )
    assert built(load_wiring(path))["c"].value == 4


def test_eager_reference_of_the_wrong_class_is_refused(write):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  p:\n    type: sample_pair\n"
        "  r:\n    type: sample_reader\n    args: {get_value: !late p.items, counter: !ref p}\n",
    )
    with pytest.raises(WiringError) as info:
        load_wiring(path)
    assert f"{path}:7: components.r.args.counter: expects Counter | None, but !ref p is a Pair" in (
        str(info.value)
    )


def test_any_takes_any_component_and_a_protocol_one_with_its_members(write, built):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  p:\n    type: sample_pair\n"
        "  o:\n    type: sample_reader\n    args: {get_value: !late p.items}\n"
        "  r:\n    type: sample_reader\n"
        "    args: {get_value: !late p.items, anything: !ref p, peer: !ref o}\n",
    )
    assembly = built(load_wiring(path))
    assert assembly["r"].anything is assembly["p"] and assembly["r"].peer is assembly["o"]


def test_a_component_lacking_a_protocols_members_is_refused(write):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  p:\n    type: sample_pair\n"
        "  r:\n    type: sample_reader\n"
        "    args: {get_value: !late p.items, peer: !ref p}\n",
    )
    with pytest.raises(WiringError) as info:
        load_wiring(path)
    assert info.value.errors == [
        f"{path}:7: components.r.args.peer: expects a Named, but !ref p is a Pair, which lacks name"
    ]


@pytest.mark.parametrize(
    ("field", "target", "missing"),
    [
        ("scheduler.tree_cache", "output_streamer", "PrefixCache, but !ref output_streamer"),
        ("scheduler.model_runner", "allocator", "which lacks forward, now"),
        ("output_streamer.sender", "tree_cache", "OutputSender, but !ref tree_cache is a"),
        ("scheduler.request_receiver", "parallel_state", "which lacks recv_requests"),
        ("scheduler.batch_result_processor", "tree_cache", "which lacks process_aborted"),
        ("batch_result_processor.output_streamer", "output_sender", "lacks stream_output"),
        ("metrics_reporter.load_inquirer", "tree_cache", "which lacks get_running_batch"),
    ],
)
def test_the_default_wiring_refuses_incompatible_components(write, field, target, missing):
    name, arg = field.split(".")
    overlay = write("o.yaml", f"components:\n  {name}:\n    args:\n      {arg}: !ref {target}\n")
    with pytest.raises(WiringError) as info:
        load_wiring(ROOT / "wiring.yaml", overlay)
    (error,) = [e for e in info.value.errors if f"components.{name}.args.{arg}" in e]
    assert error.startswith(f"{overlay}:4: ") and missing in error


def test_plain_values_are_converted_to_the_field_type(write):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  c:\n    type: sample_counter\n    args: {step: 2, tags: [a, b]}\n",
    )
    args = load_wiring(path).components["c"].args
    assert args == {"step": 2.0, "tags": ["a", "b"]}
    assert type(args["step"]) is float


def test_list_of_ints_rejects_strings_with_position(write):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  c:\n    type: sample_counter\n    args: {tags: [a, 3]}\n",
    )
    with pytest.raises(WiringError) as info:
        load_wiring(path)
    assert (
        "components.c.args.tags: invalid value ['a', 3] (Expected `str`, got `int` - at `$[1]`)"
        in (str(info.value))
    )


def test_unknown_plugin_module_is_reported(write):
    path = write("w.yaml", "plugins: [no_such_module_xyz]\ncomponents: {}\n")
    with pytest.raises(WiringError) as info:
        load_wiring(path)
    assert f"{path}:1: plugins: cannot import 'no_such_module_xyz'" in str(info.value)
