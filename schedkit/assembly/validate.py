"""Validation of a merged wiring against the component classes, before anything is built.

(Longer than 300 lines: every check of a wiring lives here, so that one pass reports them
all together.)

Every problem is collected (never just the first) as ``FILE:LINE: components.<name>.args.<key>:
<what is wrong>; <what would be valid>``.
"""

from __future__ import annotations

import collections.abc
import difflib
import importlib
import traceback
import types
import typing
from collections.abc import Collection
from typing import Any, Union

import attrs
import msgspec
from dependency_injector import containers

from schedkit.assembly.argument_checks import run_argument_checks
from schedkit.assembly.signatures import call_problem, signature_problems
from schedkit.assembly.wiring import INVALID, ComponentSpec, EnvStr, Ref, Wiring, iter_refs
from schedkit.core.component import (
    entry_point_modules,
    is_component,
    load_entry_points,
    lookup,
    registered_names,
)
from schedkit.core.protocols import COMPONENT_PROTOCOLS

__all__ = [
    "eager_edges",
    "find_cycles",
    "iter_refs",
    "resolve_type",
    "topological_order",
    "validate",
]

# Attribute names of a dependency-injector container (its class and an instance of it).
_RESERVED = frozenset(
    n
    for n in {*dir(containers.DynamicContainer), *dir(containers.DynamicContainer())}
    if not n.startswith("_")
)


def eager_edges(wiring: Wiring) -> dict[str, list[str]]:
    """component -> the components it takes eagerly (``!ref``), in argument order."""
    return {
        name: [r.target for v in spec.args.values() for r in iter_refs(v) if r.eager]
        for name, spec in wiring.components.items()
    }


def find_cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """Each distinct cycle of ``edges`` as a path that returns to its first node."""
    cycles, seen = [], set()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    cycles.append([*cycle, nxt])
            elif nxt in edges and state.get(nxt) is None:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in edges:
        if state.get(node) is None:
            visit(node)
    return cycles


def topological_order(edges: dict[str, list[str]]) -> list[str]:
    """Components ordered so that each comes after everything it takes eagerly (acyclic input)."""
    order: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> None:
        if node in done:
            return
        done.add(node)
        for dep in edges.get(node, ()):
            if dep in edges:
                visit(dep)
        order.append(node)

    for node in edges:
        visit(node)
    return order


def _importable(module_name: str, plugins: Collection[str]) -> bool:
    """Whether a ``module:Class`` type may import ``module_name``: it is (inside) a plugin
    listed in the wiring or a module advertised under the components entry point."""
    allowed = {*plugins, *entry_point_modules()}
    parts = module_name.split(".")
    return any(".".join(parts[:i]) in allowed for i in range(1, len(parts) + 1))


def resolve_type(type_name: str, plugins: Collection[str] = ()) -> tuple[type | None, str | None]:
    """The component class a ``type`` names, or ``(None, problem)``. A ``module:Class`` type
    imports nothing but a module listed in ``plugins`` (or in a package listed there) or one
    advertised under the ``schedkit.components`` entry point."""
    if ":" not in type_name:
        cls = lookup(type_name)
        if cls is not None:
            return cls, None
        components = registered_names()
        close = difflib.get_close_matches(type_name, components, n=3, cutoff=0.6)
        hint = (
            f"did you mean {', '.join(close)}?"
            if close
            else (f"registered components: {', '.join(sorted(components))}")
        )
        return None, f"unknown component type {type_name!r}; {hint} (or 'package.module:Class')"
    module_name, _, attr = type_name.partition(":")
    if not _importable(module_name, plugins):
        return None, (
            f"module {module_name!r} is not a plugin of this wiring; list it under 'plugins:' "
            "to allow importing it (or install it under the 'schedkit.components' entry point)"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        return None, f"cannot import module {module_name!r}: {exc}; check plugins and PYTHONPATH"
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    if obj is None:
        return None, f"module {module_name!r} has no attribute {attr!r}"
    if not is_component(obj):
        return None, (
            f"{type_name} is not a component; only classes declared with @schedkit.core.component "
            f"can be built from a wiring file"
        )
    return obj, None


def import_plugin(module: str) -> str | None:
    """Import a wiring's plugin module; None, or the problem with a hint at its cause."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.split(".")[0] == exc.name.split(".")[0]:
            return (
                f"cannot import {module!r}: no module named {exc.name!r} on the Python path; "
                f"run from the directory that holds it, add that directory to PYTHONPATH "
                f"(PYTHONPATH=. schedkit ...), or install your package (pip install -e .)"
            )
        return f"cannot import {module!r}: it imports {exc.name!r}, which is not installed"
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return (
            f"cannot import {module!r}: {type(exc).__name__}: {exc} "
            f"(at {frame.filename}:{frame.lineno})"
        )
    return None


def _is_callable_type(tp: Any) -> bool:
    if tp is Any or tp in (typing.Callable, collections.abc.Callable):
        return True
    origin = typing.get_origin(tp)
    if origin is collections.abc.Callable:
        return True
    if origin in (Union, types.UnionType):
        return any(_is_callable_type(a) for a in typing.get_args(tp) if a is not type(None))
    return False


def _required_class(tp: Any) -> type | None:
    """The concrete class a field requires of an eager reference (``X`` or ``X | None``)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = members[0] if len(members) == 1 else None
    if isinstance(tp, type) and tp not in (Any, object) and not getattr(tp, "_is_protocol", False):
        return tp
    return None


def _required_protocol(tp: Any) -> type | None:
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


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("collections.abc.", "")


def _has_attribute(cls: type, name: str) -> bool:
    return name in attrs.fields_dict(cls) or hasattr(cls, name)


def _conformance(protocol: type, cls: type) -> str | None:
    """What ``cls`` lacks of ``protocol`` ("it lacks ...") or which of its methods cannot be
    called as the protocol declares them; None when it conforms."""
    members = protocol_members(protocol)
    missing = [m for m in members if not _has_attribute(cls, m)]
    if missing:
        return f"it lacks {', '.join(missing)}"
    wrong = signature_problems(protocol, cls, members)
    return f"its {'; its '.join(wrong)}" if wrong else None


class _Checker:
    def __init__(self, wiring: Wiring) -> None:
        self.wiring = wiring
        self.errors: list[str] = []
        self.failed: set[str] = set()  # components with a problem reported
        self.not_conforming: set[str] = set()  # components lacking their key's protocol

    def add(self, spec: ComponentSpec, key: str | None, path: str, message: str) -> None:
        self.failed.add(spec.name)
        self.errors.append(f"{spec.where(key)}: components.{spec.name}{path}: {message}")

    def kept_by_merge(self, spec: ComponentSpec, key: str) -> bool:
        """Whether ``key`` came from an earlier file than the one that set the type."""
        sources = self.wiring.sources
        arg_file, type_file = spec.arg_locs.get(key, (spec.file, None))[0], spec.type_loc[0]
        if arg_file == type_file or arg_file not in sources or type_file not in sources:
            return False
        return sources.index(arg_file) < sources.index(type_file)

    def check_protocol(self, spec: ComponentSpec) -> None:
        """The class under a known wiring key has every member of that key's protocol."""
        protocol = COMPONENT_PROTOCOLS.get(spec.name)
        if protocol is None or spec.cls is None:
            return
        problem = _conformance(protocol, spec.cls)
        if problem:
            self.not_conforming.add(spec.name)
            self.add(
                spec,
                "type",
                ".type",
                f"{spec.cls.__name__} does not implement {protocol.__name__}, the interface "
                f"the rest of the assembly uses under the key {spec.name!r}: {problem} "
                "(see docs/components.md)",
            )

    def check_ref(self, spec: ComponentSpec, key: str, r: Ref) -> type | None:
        target = self.wiring.components.get(r.target)
        if target is None:
            close = difflib.get_close_matches(r.target, self.wiring.components, n=1)
            hint = (
                f"did you mean {close[0]}?"
                if close
                else (f"components: {', '.join(self.wiring.components)}")
            )
            self.add(spec, key, f".args.{key}", f"{r} names no component; {hint}")
            return None
        if target.name in self.not_conforming:  # its protocol problem names what it lacks
            return None
        if target.cls is not None and r.attrs and not _has_attribute(target.cls, r.attrs[0]):
            members = sorted(
                set(attrs.fields_dict(target.cls))
                | {m for m in dir(target.cls) if not m.startswith("_")}
            )
            self.add(
                spec,
                key,
                f".args.{key}",
                f"{r}: {target.cls.__name__} has no attribute {r.attrs[0]!r}; "
                f"it has: {', '.join(members)}",
            )
        return target.cls

    def check_arg(self, spec: ComponentSpec, key: str, value: Any, tp: Any) -> None:
        path = f".args.{key}"
        if value is INVALID:
            return
        if isinstance(value, Ref):
            target_cls = self.check_ref(spec, key, value)
            if value.eager:
                required = _required_class(tp)
                if (
                    target_cls is not None
                    and required is not None
                    and not value.attrs
                    and not issubclass(target_cls, required)
                ):
                    self.add(
                        spec,
                        key,
                        path,
                        f"expects {_type_name(tp)}, but {value} is a "
                        f"{target_cls.__name__}; reference a {required.__name__} component",
                    )
                protocol = _required_protocol(tp)
                if target_cls is not None and protocol is not None and not value.attrs:
                    problem = _conformance(protocol, target_cls)
                    if problem:
                        self.add(
                            spec,
                            key,
                            path,
                            f"expects a {protocol.__name__}, but {value} is a "
                            f"{target_cls.__name__}, which {problem.removeprefix('it ')}",
                        )
            elif not _is_callable_type(tp):
                self.add(
                    spec,
                    key,
                    path,
                    f"{value} gives a callable, but the field is "
                    f"{_type_name(tp)}; use !ref for an object, or declare the field "
                    f"as Callable",
                )
            elif value.kind == "call" and target_cls is not None and len(value.attrs) == 1:
                problem = call_problem(target_cls, value.attrs[0], tp)
                if problem:
                    self.add(spec, key, path, f"{value}: {problem}")
            return
        refs = list(iter_refs(value))
        for r in refs:
            self.check_ref(spec, key, r)
        if refs:
            return
        if _is_callable_type(tp) and tp is not Any:
            if value is None and type(None) in typing.get_args(tp):
                return  # an optional callable left unset
            self.add(
                spec,
                key,
                path,
                f"expects a callable ({_type_name(tp)}), got {value!r}; "
                f"bind it with !late component.attribute or !call component.method",
            )
            return
        try:
            converted = msgspec.convert(value, tp, strict=not isinstance(value, EnvStr))
        except msgspec.ValidationError as exc:
            self.add(spec, key, path, f"invalid value {value!r} ({exc}); expected {_type_name(tp)}")
            return
        except TypeError:
            if value is None and type(None) in typing.get_args(tp):
                return
            self.add(
                spec,
                key,
                path,
                f"expects an object of type {_type_name(tp)}, which a "
                f"plain value cannot give; reference a component with !ref",
            )
            return
        spec.args[key] = str(converted) if isinstance(converted, EnvStr) else converted

    def check_values(self, spec: ComponentSpec, field: attrs.Attribute, key: str) -> None:
        """Run the field's own validators (ranges, choices) on a literal argument."""
        value = spec.args.get(key)
        if field.validator is None or value is INVALID or list(iter_refs(value)):
            return
        try:
            field.validator(None, field, value)
        except (ValueError, TypeError) as exc:
            self.add(spec, key, f".args.{key}", str(exc))

    def check_component(self, spec: ComponentSpec) -> None:
        cls = spec.cls
        fields = [f for f in attrs.fields(cls) if f.init]
        try:
            hints = typing.get_type_hints(cls)
        except Exception:
            hints = {}
        by_alias = {f.alias: f for f in fields}
        kept: list[str] = []  # arguments of an earlier type that an overlay changed
        for key, value in spec.args.items():
            field = by_alias.get(key)
            if field is None:
                close = difflib.get_close_matches(key, by_alias, n=1)
                hint = f"did you mean {close[0]}? " if close else ""
                if self.kept_by_merge(spec, key):
                    kept.append(key)
                    continue
                self.add(
                    spec,
                    key,
                    f".args.{key}",
                    f"unknown argument of {cls.__name__}; "
                    f"{hint}valid arguments: {', '.join(by_alias) or '(none)'}",
                )
                continue
            reported = len(self.errors)
            self.check_arg(spec, key, value, hints.get(field.name, Any))
            if len(self.errors) == reported:  # one report per bad value
                self.check_values(spec, field, key)
        if kept:
            files = sorted({spec.arg_locs[k][0] for k in kept})
            self.add(
                spec,
                "type",
                ".args",
                f"{', '.join(kept)} (given in {', '.join(files)} for the earlier type) are not "
                f"arguments of {cls.__name__}: {spec.type_loc[0]} changes the type, and an "
                f"overlay merges over the earlier args; write `{spec.name}: !replace {{type: "
                f"{spec.type}, args: {{...}}}}` to start the entry afresh (valid arguments: "
                f"{', '.join(by_alias) or '(none)'})",
            )
        for alias, field in by_alias.items():
            if field.default is attrs.NOTHING and alias not in spec.args:
                self.add(
                    spec,
                    None,
                    f".args.{alias}",
                    f"missing required argument of {cls.__name__} "
                    f"({_type_name(hints.get(field.name, Any))})",
                )


def validate(wiring: Wiring) -> list[str]:
    """Check ``wiring`` against its component classes; return every problem found.

    On success, each spec's ``cls`` is set and plain argument values are converted to their
    field types, and the wiring is marked validated.
    """
    errors = list(load_entry_points())
    failed_plugins = []
    for module, file, line in wiring.plugins:
        problem = import_plugin(module)
        if problem:
            where = file if line is None else f"{file}:{line}"
            errors.append(f"{where}: plugins: {problem}")
            failed_plugins.append(module)
    checker = _Checker(wiring)
    for spec in wiring.components.values():
        if spec.name in _RESERVED:
            checker.add(
                spec, None, "", "this name is reserved by the container; rename the component"
            )
        if spec.type is not None:
            spec.cls, problem = resolve_type(spec.type, [p for p, _, _ in wiring.plugins])
            if problem and failed_plugins and ":" not in spec.type:
                # The type may be one the plugin would have registered: no guess at others.
                problem = (
                    f"unknown component type {spec.type!r}, perhaps registered by the plugin "
                    f"{', '.join(failed_plugins)} that failed to import (see its problem)"
                )
            if problem:
                checker.add(spec, "type", ".type", problem)
            checker.check_protocol(spec)
    for spec in wiring.components.values():
        if spec.cls is not None:
            checker.check_component(spec)
    run_argument_checks(wiring, set(checker.failed), checker.add)
    for cycle in find_cycles(eager_edges(wiring)):
        first = wiring.components[cycle[0]]
        checker.add(
            first,
            None,
            "",
            "eager !ref cycle "
            + " -> ".join(cycle)
            + "; make one edge of it !late (or !call) to break the cycle",
        )
    errors += checker.errors
    wiring.validated = not errors
    return errors
