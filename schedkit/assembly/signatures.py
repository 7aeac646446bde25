"""Whether a class's methods can be called the way a Protocol declares them.

The rest of an assembly calls a component's methods as its Protocol spells them: required
parameters by position, parameters with a default by position or by name, or not at all. A
method fits when every such call binds: it takes at least the Protocol's positional
parameters (or ``*args``), has the same name for each parameter that may be passed by name,
gives a default wherever the Protocol does, and requires nothing the Protocol does not pass.
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from typing import Any, Union

__all__ = ["call_problem", "method_problem", "signature_problems"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _signature(owner: type, name: str) -> inspect.Signature | None:
    """The signature of ``owner.name`` as called on an instance (no ``self``), or None for
    an attribute that is not a method or a signature Python cannot tell."""
    static = inspect.getattr_static(owner, name, None)
    if isinstance(static, (staticmethod, classmethod)):
        function, bound = static.__func__, isinstance(static, classmethod)
    elif inspect.isfunction(static):
        function, bound = static, True
    else:
        return None
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    parameters = list(signature.parameters.values())
    if bound and parameters and parameters[0].kind in _POSITIONAL:
        parameters = parameters[1:]
    return signature.replace(parameters=parameters)


def method_problem(expected: inspect.Signature, actual: inspect.Signature) -> str | None:
    """Why a method with signature ``actual`` cannot take every call ``expected`` allows."""
    params = list(actual.parameters.values())
    positional = [p for p in params if p.kind in _POSITIONAL]
    by_name = {p.name: p for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    var_args = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    var_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    used: set[str] = set()
    index = 0
    for want in expected.parameters.values():
        if want.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            if not (var_args if want.kind is inspect.Parameter.VAR_POSITIONAL else var_kwargs):
                return f"does not take {want}"
            continue
        optional = want.default is not inspect.Parameter.empty
        if want.kind in _POSITIONAL:
            if index < len(positional):
                have = positional[index]
            elif var_args:
                index += 1
                continue
            else:
                passed = sum(p.kind in _POSITIONAL for p in expected.parameters.values())
                return (
                    f"takes {len(positional)} positional argument(s); callers pass up to "
                    f"{passed} ({want.name!r} has no place)"
                )
            index += 1
            used.add(have.name)
            may_be_named = want.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and optional
            if may_be_named and not var_kwargs:
                if have.name != want.name:
                    return (
                        f"names its parameter {index} {have.name!r}; callers may pass {want.name!r}"
                    )
                if have.kind is inspect.Parameter.POSITIONAL_ONLY:
                    return f"takes {have.name!r} by position only; callers may pass it by name"
        else:  # keyword-only
            have = by_name.get(want.name)
            if have is None:
                if var_kwargs:
                    continue
                return f"takes no argument {want.name!r}"
            used.add(have.name)
        if optional and have.default is inspect.Parameter.empty:
            return f"requires {have.name!r}, which callers may leave out (default it)"
    required = [
        p.name
        for p in params
        if p.name not in used
        and p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if required:
        return f"requires {', '.join(map(repr, required))}, which callers do not pass"
    return None


def signature_problems(protocol: type, cls: type, members: list[str]) -> list[str]:
    """``name(...)``: what is wrong, for each method of ``members`` that ``cls`` has but
    cannot be called as ``protocol`` declares it."""
    problems = []
    for name in members:
        expected = _declared_signature(protocol, name)
        if expected is None or not hasattr(cls, name):
            continue
        actual = _signature(cls, name)
        if actual is None:
            continue
        problem = method_problem(expected, actual)
        if problem is not None:
            problems.append(
                f"{name}{_plain(actual)} {problem} (the protocol: {name}{_plain(expected)})"
            )
    return problems


def _plain(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` without annotations, as a message shows it."""
    empty = inspect.Parameter.empty
    return signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=empty,
    )


def _declared_signature(protocol: type, name: str) -> inspect.Signature | None:
    for base in protocol.__mro__:
        if name in vars(base):
            value: Any = vars(base)[name]
            return _signature(base, name) if inspect.isfunction(value) else None
    return None


def _callable_arity(tp: Any) -> int | None:
    """How many positional arguments a field typed ``Callable[[A, B], R]`` (or that ``| None``)
    is called with; None when the type does not say."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = members[0] if len(members) == 1 else None
    if typing.get_origin(tp) is not collections.abc.Callable:
        return None
    arguments = typing.get_args(tp)
    return len(arguments[0]) if arguments and isinstance(arguments[0], list) else None


def call_problem(cls: type, method: str, field_type: Any) -> str | None:
    """Why ``!call component.method`` cannot stand for a field of ``field_type`` (a
    ``Callable[[...], R]`` called with that many positional arguments), or None."""
    arity = _callable_arity(field_type)
    actual = _signature(cls, method) if arity is not None else None
    if actual is None:
        return None
    expected = inspect.Signature(
        [inspect.Parameter(f"_{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(arity)]
    )
    if method_problem(expected, actual) is None:
        return None
    return (
        f"the field calls it with {arity} positional argument(s), which "
        f"{cls.__name__}.{method}{_plain(actual)} cannot take; bind a method of that arity"
    )
