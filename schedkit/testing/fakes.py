"""``fake(ComponentClass, **attributes)``: a test double with exactly a component's interface.

The double is not an instance of the component (the real class is never instantiated) but
passes ``isinstance`` checks for it. It has the component's attrs fields, with the values given
or the fields' defaults, and its properties, with the values given. Each method of the
component is a recording stub whose arguments are checked against the real method's
signature. Anything else is refused: an unknown attribute, a method the component does not
have, a call with the wrong arguments, and setting an attribute that is not a field (or any
attribute of a frozen component once the double exists).

``fake(Protocol)`` (one of ``schedkit.core.protocols``, or your own) makes the same double of a
protocol: its annotated attributes are the fields (no defaults: an attribute not given raises
when read), its methods the stubs. A stub declared to return something raises
``UnconfiguredCall`` when called without ``returns=`` or ``side_effects=`` for it, instead of
answering None; one declared ``-> None`` records the call.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from schedkit.testing.fake_interface import DOUBLE_STATE, Interface

__all__ = ["Call", "UnconfiguredCall", "fake"]


class Call(tuple):
    """One recorded call: equal to the tuple ``(name, args, kwargs)``.

    ``arguments`` maps every parameter of the real method to the value it received (defaults
    filled in), so an assertion need not care whether an argument was passed by position.
    Arguments are recorded by reference, as ``unittest.mock`` does.
    """

    def __new__(
        cls, name: str, args: tuple, kwargs: dict[str, Any], arguments: dict[str, Any]
    ) -> Call:
        call = super().__new__(cls, (name, args, kwargs))
        call.arguments = arguments
        return call

    @property
    def name(self) -> str:
        return self[0]

    @property
    def args(self) -> tuple:
        return self[1]

    @property
    def kwargs(self) -> dict[str, Any]:
        return self[2]


class UnconfiguredCall(AssertionError):
    """A fake made from a protocol was called for a value nobody configured."""


def _returns_nothing(signature: inspect.Signature) -> bool:
    annotation = signature.return_annotation
    return annotation in (None, "None", type(None))


class _Fake:
    """Base of the generated double classes; see ``fake``."""

    __slots__ = DOUBLE_STATE
    _interface: Interface

    @property
    def __class__(self) -> type:  # isinstance(double, Component) holds
        interface = self._interface
        return type(self) if interface.protocol else interface.cls

    def calls_to(self, method: str) -> list[Call]:
        """The recorded calls of ``method``, oldest first."""
        interface = self._interface
        if method not in interface.methods:
            raise AttributeError(
                f"{interface.name} has no method {method!r}; methods: {interface.public_methods()}"
            )
        return [call for call in self.calls if call[0] == method]

    def __getattr__(self, name: str) -> Any:
        # Reached only for names that are not methods or the double's own state.
        interface = object.__getattribute__(self, "_interface")
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        if name in interface.fields or name in interface.properties:
            kind = "field" if name in interface.fields else "property"
            raise AttributeError(
                f"fake {interface.name}: {kind} {name!r} has no value; "
                f"pass fake({interface.name}, {name}=...)"
            )
        raise AttributeError(
            f"{interface.name} has no attribute {name!r}; methods: "
            f"{interface.public_methods()}; fields and properties: {interface.attribute_names()}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name in DOUBLE_STATE:
            object.__setattr__(self, name, value)
            return
        interface = self._interface
        if name in interface.methods:
            raise AttributeError(
                f"cannot set {name!r} on fake {interface.name}: it is a method; configure it "
                f"with double.returns[{name!r}] or double.side_effects[{name!r}]"
            )
        if name not in interface.fields and name not in interface.properties:
            raise AttributeError(
                f"cannot set {name!r} on fake {interface.name}: it is not a field; fields and "
                f"properties: {interface.attribute_names()}"
            )
        if interface.frozen and self._ready:
            raise attrs.exceptions.FrozenInstanceError()
        self._values[name] = value

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete {name!r} from fake {self._interface.name}")

    def __repr__(self) -> str:
        return f"<fake {self._interface.name}: {len(self.calls)} calls>"


def _stub(interface: Interface, name: str, signature: inspect.Signature) -> Callable:
    where = f"{interface.name}.{name}{signature}"
    # A protocol's fake returns nothing it was not told to, except from a method declared to
    # return None; a component's fake returns None (its real methods are there to read).
    strict = interface.protocol and not _returns_nothing(signature)

    def method(self: _Fake, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{where}: {exc}") from None
        bound.apply_defaults()
        self.calls.append(Call(name, args, kwargs, dict(bound.arguments)))
        effect = self.side_effects.get(name)
        if effect is not None:
            return effect(*args, **kwargs)
        if name in self.returns or not strict:
            return self.returns.get(name)
        raise UnconfiguredCall(
            f"fake {where} was called, but nothing says what it returns: pass "
            f"fake({interface.name}, returns={{{name!r}: ...}}) or side_effects=, or set "
            f"double.returns[{name!r}]"
        )

    method.__name__ = name
    method.__qualname__ = f"fake {interface.name}.{name}"
    method.__signature__ = signature
    return method


@functools.cache
def _fake_class(cls: type) -> type[_Fake]:
    interface = Interface(cls)
    namespace: dict[str, Any] = {"__slots__": (), "_interface": interface}
    for name, signature in interface.methods.items():
        namespace[name] = _stub(interface, name, signature)
    return type(f"Fake{cls.__name__}", (_Fake,), namespace)


def _check_methods(interface: Interface, option: str, mapping: Mapping[str, Any]) -> None:
    unknown = [name for name in mapping if name not in interface.methods]
    if unknown:
        raise TypeError(
            f"fake({interface.name}, {option}=...): {interface.name} has no method "
            f"{', '.join(map(repr, unknown))}; methods: {interface.public_methods()}"
        )


def fake(
    cls: type,
    /,
    *,
    returns: Mapping[str, Any] | None = None,
    side_effects: Mapping[str, Callable[..., Any]] | None = None,
    **attributes: Any,
) -> Any:
    """A recording double of the attrs (component) class or protocol ``cls``, without
    instantiating it (a protocol's double raises ``UnconfiguredCall`` for a value it was not
    given; see the module docstring).

    ``attributes`` set fields (by name or constructor alias) and properties; fields not given
    take their default (a factory is called), and a field without a default has no value until
    one is set. ``returns`` maps a method name to the value it returns (None otherwise);
    ``side_effects`` maps a method name to a callable that receives the call's arguments and
    whose result (or exception) is the method's. Both dicts stay editable on the double
    (``double.returns["forward"] = ...``). ``double.calls`` lists every ``Call`` in order;
    ``double.calls_to("name")`` those of one method.
    """
    fake_cls = _fake_class(cls)
    interface = fake_cls._interface
    _check_methods(interface, "returns", returns or {})
    _check_methods(interface, "side_effects", side_effects or {})
    double = object.__new__(fake_cls)
    double._ready = False
    double._values = {}
    double.calls = []
    double.returns = dict(returns or {})
    double.side_effects = dict(side_effects or {})
    given = {interface.aliases.get(key, key): value for key, value in attributes.items()}
    unknown = [
        key
        for key, name in zip(attributes, given, strict=True)
        if name not in interface.fields and name not in interface.properties
    ]
    if unknown:
        raise TypeError(
            f"fake({interface.name}): unknown attribute(s) {', '.join(map(repr, unknown))}; "
            f"fields and properties: {interface.attribute_names()} (methods are configured "
            "with returns= or side_effects=)"
        )
    for name, field in interface.fields.items():
        if name in given:
            double._values[name] = given[name]
        elif isinstance(field.default, attrs.Factory):
            factory = field.default
            double._values[name] = (
                factory.factory(double) if factory.takes_self else factory.factory()
            )
        elif field.default is not attrs.NOTHING:
            double._values[name] = field.default
    for name in interface.properties & given.keys():
        double._values[name] = given[name]
    double._ready = True
    return double
