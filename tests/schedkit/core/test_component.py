import subprocess
import sys
import textwrap

import attrs
import pytest

from schedkit import component, component_name, is_component, registered
from schedkit.core.component import ComponentRegistrationError, at_least, load_entry_points
from tests.schedkit.sample_components import Counter, Pair


def test_component_is_a_slotted_keyword_only_attrs_class():
    counter = Counter(start=3)
    assert attrs.has(Counter)
    assert not hasattr(counter, "__dict__")
    assert counter.value == 3
    with pytest.raises(TypeError):
        Counter(3)


def test_frozen_component_rejects_assignment():
    pair = Pair(items=[1])
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        pair.items = []


def test_validators_run_at_construction_and_assignments_stay_plain():
    @component("sample_validated_for_setattr")
    class Validated:
        size: int = attrs.field(default=1, validator=at_least(1))

    with pytest.raises(ValueError, match="size must be an integer >= 1, got 0"):
        Validated(size=0)
    built = Validated(size=2)
    assert type(built).__setattr__ is object.__setattr__  # no hook on hot-path writes
    built.size = 5
    assert built.size == 5


def test_default_name_is_snake_case_of_the_class_name():
    @component
    class KvEventsPublisherForNaming:
        pass

    @component
    class HTTPThingForNaming:
        pass

    assert component_name(KvEventsPublisherForNaming) == "kv_events_publisher_for_naming"
    assert component_name(HTTPThingForNaming) == "http_thing_for_naming"
    assert registered()["http_thing_for_naming"] is HTTPThingForNaming
    assert is_component(HTTPThingForNaming)
    assert not is_component(object)


def test_two_classes_claiming_one_name_is_an_error_naming_both():
    @component("contested_name")
    class First:
        pass

    with pytest.raises(ComponentRegistrationError) as info:

        @component("contested_name")
        class Second:
            pass

    message = str(info.value)
    assert "First" in message and "Second" in message and "contested_name" in message


def test_component_module_imports_nothing_from_the_container():
    code = (
        "import sys, schedkit.core.component\n"
        "assert 'schedkit.assembly.container' not in sys.modules, 'container imported'\n"
        "assert 'dependency_injector' not in sys.modules, 'dependency_injector imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_builtin_components_register_through_the_entry_point():
    names = registered()
    assert names["radix_cache"].__module__ == "schedkit.components.cache.radix_cache"


def test_third_party_entry_point_registers_its_components(tmp_path, monkeypatch):
    package = tmp_path / "thirdparty_sched"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            from schedkit import component

            @component("thirdparty_widget")
            class Widget:
                size: int = 1
            """
        )
    )
    dist = tmp_path / "thirdparty_sched-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-sched\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[schedkit.components]\nwidgets = thirdparty_sched\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_entry_points(refresh=True) == []
    assert registered()["thirdparty_widget"].__module__ == "thirdparty_sched"
