"""What a faked class offers: its fields, properties and methods with their signatures, read
from an attrs (component) class or a ``typing.Protocol``; ``fakes`` builds the double from it."""

from __future__ import annotations

import inspect
import typing

import attrs

__all__ = ["DOUBLE_STATE", "RESERVED", "Interface"]

# The double's own API and state: a component declaring a member of one of these names cannot
# be faked.
RESERVED = ("calls", "calls_to", "returns", "side_effects")
DOUBLE_STATE = ("_values", "_ready", "calls", "returns", "side_effects")


class Interface:
    """What a component class or protocol offers: fields, properties and methods with their
    signatures."""

    def __init__(self, cls: type) -> None:
        self.protocol = bool(getattr(cls, "_is_protocol", False))
        if not attrs.has(cls) and not self.protocol:
            raise TypeError(
                "fake() takes an attrs class such as a @schedkit.core.component, or a "
                f"typing.Protocol such as those of schedkit.core.protocols, got {cls!r}"
            )
        self.cls = cls
        self.name = cls.__name__
        if self.protocol:
            self.fields = {name: _ProtocolField() for name in _protocol_attributes(cls)}
            self.aliases: dict[str, str] = {}
            self.frozen = False
        else:
            self.fields = {f.name: f for f in attrs.fields(cls)}
            self.aliases = {f.alias: f.name for f in attrs.fields(cls) if f.alias != f.name}
            # attrs makes a frozen class's __setattr__ this function.
            self.frozen = getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs"
        self.properties: set[str] = set()
        self.methods: dict[str, inspect.Signature] = {}
        mro = [k for k in cls.__mro__[:-1] if k not in (typing.Protocol, typing.Generic)]
        for klass in reversed(mro):  # object's members are not the interface
            for name, member in vars(klass).items():
                if name.startswith("_") and self.protocol:
                    continue
                if name.startswith("__") or name in self.fields:
                    continue
                if isinstance(member, property):
                    self.properties.add(name)
                    self.methods.pop(name, None)
                elif isinstance(member, staticmethod):
                    self.methods[name] = inspect.signature(member.__func__)
                elif isinstance(member, classmethod) or inspect.isfunction(member):
                    func = member.__func__ if isinstance(member, classmethod) else member
                    signature = inspect.signature(func)
                    parameters = list(signature.parameters.values())[1:]  # self / cls
                    self.methods[name] = signature.replace(parameters=parameters)
                    self.properties.discard(name)
        declared = set(self.fields) | self.properties | set(self.methods)
        clash = sorted((set(RESERVED) | set(DOUBLE_STATE)) & declared)
        if clash:
            raise TypeError(
                f"cannot fake {self.name}: it declares {', '.join(clash)}, which the double "
                f"uses for its own API ({', '.join(RESERVED)})"
            )

    def public_methods(self) -> str:
        return ", ".join(sorted(m for m in self.methods if not m.startswith("_"))) or "(none)"

    def attribute_names(self) -> str:
        names = [n for n in self.fields if not n.startswith("_")] + sorted(self.properties)
        return ", ".join(names) or "(none)"


class _ProtocolField:
    """An attribute a protocol declares: it has no default, so a fake has no value until one
    is given."""

    default = attrs.NOTHING


def _protocol_attributes(protocol: type) -> list[str]:
    names: dict[str, None] = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object, typing.Protocol, typing.Generic):
            continue
        names.update(dict.fromkeys(n for n in vars(klass).get("__annotations__", {})))
    return [n for n in names if not n.startswith("_")]
