import inspect

import attrs
import pytest

from schedkit.core.protocols import LoadInquirerComponent
from schedkit.testing import fake
from schedkit.testing.fake_interface import Interface


@attrs.define
class _Counter:
    step: int
    _total: int = 0
    frozen_like: bool = attrs.field(default=False, alias="frozen")

    @property
    def total(self) -> int:
        return self._total

    def add(self, n: int, *, times: int = 1) -> int:
        return n * times

    @classmethod
    def build(cls, step: int) -> "_Counter":
        return cls(step=step)

    @staticmethod
    def unit() -> int:
        return 1

    def _private(self) -> None:
        pass


def test_a_component_s_fields_properties_and_methods_without_self():
    interface = Interface(_Counter)
    assert not interface.protocol and not interface.frozen
    assert list(interface.fields) == ["step", "_total", "frozen_like"]
    assert interface.aliases == {"total": "_total", "frozen": "frozen_like"}
    assert interface.properties == {"total"}
    assert str(interface.methods["add"]) == "(n: int, *, times: int = 1) -> int"
    assert list(interface.methods["build"].parameters) == ["step"]
    assert interface.methods["unit"] == inspect.signature(_Counter.unit)
    assert interface.public_methods() == "add, build, unit"
    assert interface.attribute_names() == "step, frozen_like, total"


def test_a_protocol_s_annotations_are_fields_without_defaults_and_inherited():
    interface = Interface(LoadInquirerComponent)
    assert interface.protocol
    assert list(interface.fields) == ["allocator", "get_running_batch", "get_waiting_queue"]
    assert all(f.default is attrs.NOTHING for f in interface.fields.values())
    assert interface.public_methods() == "get_loads, num_used_tokens"


def test_a_frozen_component_is_seen_frozen():
    @attrs.frozen
    class Fixed:
        size: int

    assert Interface(Fixed).frozen


def test_reserved_names_and_non_attrs_classes_are_refused():
    with pytest.raises(TypeError, match="takes an attrs class"):
        fake(dict)

    @attrs.define
    class Recorder:
        calls: list

    with pytest.raises(TypeError, match="declares calls, which the double uses"):
        fake(Recorder)
