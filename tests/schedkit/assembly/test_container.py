import pytest

from schedkit import ComponentBuildError, WiringError, build, load_wiring
from tests.schedkit.sample_components import EVENTS, Counter

WIRING = """\
plugins: [tests.schedkit.sample_components]
components:
  counter:
    type: sample_counter
    args: {start: 1}
  reader:
    type: sample_reader
    args:
      get_value: !late counter.value
      bump: !call counter.bump
      counter: !ref counter
  pair:
    type: sample_pair
    args:
      items: [!ref counter, !late counter.value, 3]
      by_name: {reader: !ref reader, start: !ref counter.start}
"""


class FakeCounter:
    def __init__(self, value):
        self.value = value
        self.start = value
        self.calls = []

    def bump(self, by=1):
        self.calls.append(by)
        return -1


@pytest.fixture
def wiring(write):
    return load_wiring(write("w.yaml", WIRING))


def test_late_binding_reads_the_value_at_call_time(wiring, built):
    assembly = built(wiring)
    reader, counter = assembly["reader"], assembly["counter"]
    assert reader.counter is counter
    assert reader.get_value() == 1
    counter.value = 42
    assert reader.get_value() == 42
    assert reader.bump(by=8) == 50
    assert counter.value == 50
    assert reader.bump == counter.bump  # bound at assembly time: a plain attribute


def test_references_nested_in_lists_and_mappings(wiring, built):
    assembly = built(wiring)
    pair = assembly["pair"]
    assert pair.items[0] is assembly["counter"]
    assert pair.items[1]() == 1 and pair.items[2] == 3
    assert pair.by_name == {"reader": assembly["reader"], "start": 1}


def test_build_order_follows_eager_references(wiring, built):
    assert built(wiring).names() == ["counter", "reader", "pair"]


def test_build_overrides_reach_eager_and_late_references(wiring, built):
    fake = FakeCounter(7)
    assembly = built(wiring, overrides={"counter": fake})
    reader = assembly["reader"]
    assert assembly["counter"] is fake
    assert reader.counter is fake
    assert reader.get_value() == 7
    assert reader.bump(3) == -1 and fake.calls == [3]
    assert assembly["pair"].items[0] is fake


def test_build_override_stands_in_for_a_component_that_would_fail(write, built):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  c:\n    type: sample_exploding\n"
        "  r:\n    type: sample_reader\n    args: {get_value: !late c.fuse}\n",
    )
    assembly = built(load_wiring(path), overrides={"c": FakeCounter(0)})
    assert assembly["r"].get_value.__name__ == "late c.fuse"


def test_assembly_override_swaps_within_the_block_and_restores(wiring, built):
    assembly = built(wiring)
    original_reader, original_counter = assembly["reader"], assembly["counter"]
    fake = FakeCounter(99)
    with assembly.override(counter=fake) as overridden:
        assert overridden is assembly
        assert assembly["counter"] is fake
        assert assembly["reader"] is not original_reader
        assert assembly["reader"].counter is fake
        assert assembly["reader"].get_value() == 99
        assert original_reader.get_value() == 99  # late references see the override too
        assert original_reader.bump(5) == -1 and fake.calls == [5]
        assert assembly["pair"].by_name["reader"] is assembly["reader"]
    assert assembly["counter"] is original_counter
    assert assembly["reader"] is original_reader
    assert original_reader.get_value() == 1
    assert original_reader.bump == original_counter.bump
    assert original_reader.bump(2) == 3 and fake.calls == [5]


def test_misspelt_override_names_raise(wiring, built):
    misspelt = r"unknown component 'countr' in .*; did you mean counter"
    with pytest.raises(WiringError, match=misspelt):
        build(wiring, overrides={"countr": object()})
    assembly = built(wiring)
    with (
        pytest.raises(WiringError, match="unknown component 'redaer'"),
        assembly.override(redaer=object()),
    ):
        pass
    with pytest.raises(WiringError, match="unknown component 'nope'"):
        assembly["nope"]


def test_constructor_error_names_component_entry_and_message(write):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  ok:\n    type: sample_closable\n    args: {label: ok}\n"
        "  bomb:\n    type: sample_exploding\n    args: {fuse: 3}\n",
    )
    with pytest.raises(ComponentBuildError) as info:
        build(load_wiring(path))
    assert str(info.value) == (
        f"{path}:6: components.bomb: Exploding(...) raised RuntimeError: boom after 3"
    )
    assert EVENTS == ["shutdown ok"]  # what was built before the failure is shut down


def test_shutdown_stops_each_component_once_dependents_first(write, built):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  last:\n    type: sample_closable\n    args: {label: last, before: !ref first}\n"
        "  first:\n    type: sample_closable\n    args: {label: first}\n"
        "  closer:\n    type: sample_close_only\n"
        "  plain:\n    type: sample_counter\n",
    )
    assembly = built(load_wiring(path))
    assert assembly.names() == ["first", "last", "closer", "plain"]
    assembly.shutdown()
    assembly.shutdown()
    assert sorted(EVENTS) == ["close close-only", "shutdown first", "shutdown last"]
    assert EVENTS.index("shutdown last") < EVENTS.index("shutdown first")
    assert assembly.is_shut_down and assembly["last"].before is assembly["first"]


def test_override_block_shuts_down_the_components_it_rebuilt(write):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  a:\n    type: sample_closable\n    args: {label: a}\n"
        "  b:\n    type: sample_closable\n    args: {label: b, before: !ref a}\n",
    )
    with build(load_wiring(path)) as assembly:
        with assembly.override(a=Counter()):
            assert EVENTS == []
        assert EVENTS == ["shutdown b"]
    assert EVENTS == ["shutdown b", "shutdown b", "shutdown a"]


def test_build_accepts_a_mapping(built):
    assembly = built(
        {
            "plugins": ["tests.schedkit.sample_components"],
            "components": {"c": {"type": "sample_counter", "args": {"start": 5}}},
        }
    )
    assert assembly["c"].value == 5


def test_shutdown_follows_references_through_attributes_and_lists(write, built):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  top:\n    type: sample_closable\n    args: {label: top, before: !ref mid.label}\n"
        "  mid:\n    type: sample_closable\n    args: {label: mid, before: [!ref base]}\n"
        "  base:\n    type: sample_closable\n    args: {label: base}\n",
    )
    built(load_wiring(path)).shutdown()
    assert EVENTS == ["shutdown top", "shutdown mid", "shutdown base"]


def test_a_failing_shutdown_is_raised_after_every_component_stopped(write, built):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  a:\n    type: sample_closable\n    args: {label: a}\n"
        "  b:\n    type: sample_closable\n    args: {label: b, before: !ref a, fail: true}\n"
        "  c:\n    type: sample_closable\n    args: {label: c, before: !ref b}\n",
    )
    assembly = built(load_wiring(path))
    with pytest.raises(RuntimeError, match="b failed to stop"):
        assembly.shutdown()
    assert EVENTS == ["shutdown c", "shutdown b", "shutdown a"]
    assembly.shutdown()  # once only: nothing runs or raises again
    assert len(EVENTS) == 3


def test_a_late_reference_used_before_its_target_is_built_is_named(write):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  early:\n    type: sample_reads_at_build\n    args: {get_value: !late later.value}\n"
        "  later:\n    type: sample_counter\n    args: {start: 4}\n",
    )
    with pytest.raises(ComponentBuildError) as info:
        build(load_wiring(path))
    assert "components.early: ReadsAtBuild(...) raised WiringError: components.later is " in str(
        info.value
    )
    assert "has not been built yet" in str(info.value)


def test_a_late_reference_to_a_component_built_earlier_works_in_a_constructor(write, built):
    path = write(
        "w.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        "  earlier:\n    type: sample_counter\n    args: {start: 4}\n"
        "  reader:\n    type: sample_reads_at_build\n    args: {get_value: !late earlier.value}\n",
    )
    assert built(load_wiring(path))["reader"].seen == 4
