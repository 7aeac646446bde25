"""Checking each component of a wiring against its class, every problem collected: the
protocol of its wiring key, its references, its argument values (converted to the field types
on the way) and its missing arguments."""

from __future__ import annotations

import difflib
import typing
from typing import Any

import attrs
import msgspec

from schedkit.assembly.conformance import (
    conformance,
    has_attribute,
    is_callable_type,
    required_class,
    required_protocol,
    type_name,
)
from schedkit.assembly.signatures import call_problem
from schedkit.assembly.wiring import INVALID, ComponentSpec, EnvStr, Ref, Wiring, iter_refs
from schedkit.core.component_protocols import COMPONENT_PROTOCOLS

__all__ = ["SpecChecker"]


class SpecChecker:
    """Collects the problems of a wiring's component specs as ``FILE:LINE:
    components.<name><path>: <message>`` in ``errors``."""

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
        problem = conformance(protocol, spec.cls)
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
        if target.cls is not None and r.attrs and not has_attribute(target.cls, r.attrs[0]):
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
                required = required_class(tp)
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
                        f"expects {type_name(tp)}, but {value} is a "
                        f"{target_cls.__name__}; reference a {required.__name__} component",
                    )
                protocol = required_protocol(tp)
                if target_cls is not None and protocol is not None and not value.attrs:
                    problem = conformance(protocol, target_cls)
                    if problem:
                        self.add(
                            spec,
                            key,
                            path,
                            f"expects a {protocol.__name__}, but {value} is a "
                            f"{target_cls.__name__}, which {problem.removeprefix('it ')}",
                        )
            elif not is_callable_type(tp):
                self.add(
                    spec,
                    key,
                    path,
                    f"{value} gives a callable, but the field is "
                    f"{type_name(tp)}; use !ref for an object, or declare the field "
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
        if is_callable_type(tp) and tp is not Any:
            if value is None and type(None) in typing.get_args(tp):
                return  # an optional callable left unset
            self.add(
                spec,
                key,
                path,
                f"expects a callable ({type_name(tp)}), got {value!r}; "
                f"bind it with !late component.attribute or !call component.method",
            )
            return
        try:
            converted = msgspec.convert(value, tp, strict=not isinstance(value, EnvStr))
        except msgspec.ValidationError as exc:
            self.add(spec, key, path, f"invalid value {value!r} ({exc}); expected {type_name(tp)}")
            return
        except TypeError:
            if value is None and type(None) in typing.get_args(tp):
                return
            self.add(
                spec,
                key,
                path,
                f"expects an object of type {type_name(tp)}, which a "
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
                    f"({type_name(hints.get(field.name, Any))})",
                )
