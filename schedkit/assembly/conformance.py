"""What a field's type asks of a wiring value, and whether a component class conforms to a
protocol (its members, then its methods' signatures)."""

from __future__ import annotations

import collections.abc
import types
import typing
from typing import Any, Union

import attrs

from schedkit.assembly.signatures import signature_problems

__all__ = [
    "conformance",
    "has_attribute",
    "is_callable_type",
    "protocol_members",
    "required_class",
    "required_protocol",
    "type_name",
]


def is_callable_type(tp: Any) -> bool:
    """Whether a field of type ``tp`` takes a callable (``Callable``, ``Any``, or a union with
    one)."""
    if tp is Any or tp in (typing.Callable, collections.abc.Callable):
        return True
    origin = typing.get_origin(tp)
    if origin is collections.abc.Callable:
        return True
    if origin in (Union, types.UnionType):
        return any(is_callable_type(a) for a in typing.get_args(tp) if a is not type(None))
    return False


def required_class(tp: Any) -> type | None:
    """The concrete class a field requires of an eager reference (``X`` or ``X | None``)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = members[0] if len(members) == 1 else None
    if isinstance(tp, type) and tp not in (Any, object) and not getattr(tp, "_is_protocol", False):
        return tp
    return None


def required_protocol(tp: Any) -> type | None:
    """The ``typing.Protocol`` a field's type names (``P`` or ``P | None``), if any."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = members[0] if len(members) == 1 else None
    return tp if getattr(tp, "_is_protocol", False) else None


def protocol_members(protocol: type) -> list[str]:
    """The attributes and methods a class must have to satisfy ``protocol``."""
    names: set[str] = set()
    for base in protocol.__mro__:
        if base in (object, typing.Protocol, typing.Generic):
            continue
        names.update(getattr(base, "__annotations__", {}))
        names.update(n for n, v in vars(base).items() if callable(v) or isinstance(v, property))
    return sorted(n for n in names if not n.startswith("_"))


def type_name(tp: Any) -> str:
    """``tp`` as a wiring author reads it (``int | None``, ``Callable[[], float]``)."""
    if tp is type(None):
        return "None"
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("collections.abc.", "")


def has_attribute(cls: type, name: str) -> bool:
    """Whether ``cls`` has ``name`` as a field or a class attribute."""
    return name in attrs.fields_dict(cls) or hasattr(cls, name)


def conformance(protocol: type, cls: type) -> str | None:
    """What ``cls`` lacks of ``protocol`` ("it lacks ...") or which of its methods cannot be
    called as the protocol declares them; None when it conforms."""
    members = protocol_members(protocol)
    missing = [m for m in members if not has_attribute(cls, m)]
    if missing:
        return f"it lacks {', '.join(missing)}"
    wrong = signature_problems(protocol, cls, members)
    return f"its {'; its '.join(wrong)}" if wrong else None
