"""Running components' own cross-argument checks (``check_arguments``) on a wiring's values,
before anything is built, so that ``schedkit validate`` passing means build passes.

A check reads ``args.<field>``: the wiring's value, the field's default, or, through an eager
``!ref``, the referenced component's value (``allocator.page_size`` when the allocator's entry
sets ``page_size``). What a build alone would know (a late reference, a property computed by a
constructor) raises ``UnknownArgument`` and leaves that check to build time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from schedkit.assembly.wiring import INVALID, ComponentSpec, Ref, Wiring, iter_refs
from schedkit.core.component import ArgumentError, UnknownArgument

__all__ = ["ArgumentView", "run_argument_checks"]

_MAX_DEPTH = 8  # eager references followed from one check (a cycle is reported elsewhere)


class ArgumentView:
    """A component's arguments as attributes, for its ``check_arguments``."""

    __slots__ = ("_depth", "_spec", "_wiring")

    def __init__(self, wiring: Wiring, spec: ComponentSpec, depth: int = 0) -> None:
        self._wiring, self._spec, self._depth = wiring, spec, depth

    def __getattr__(self, name: str) -> Any:
        spec = self._spec
        if spec.cls is None or not attrs.has(spec.cls):
            raise UnknownArgument(name)
        fields = attrs.fields_dict(spec.cls)
        field = fields.get(name)
        if field is None or not field.init:
            raise UnknownArgument(name)
        if field.alias in spec.args:
            return self._resolve(spec.args[field.alias], name)
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            if field.default.takes_self:
                raise UnknownArgument(name)
            return field.default.factory()
        if field.default is attrs.NOTHING:
            raise UnknownArgument(name)
        return field.default

    def _resolve(self, value: Any, name: str) -> Any:
        if value is INVALID or self._depth >= _MAX_DEPTH:
            raise UnknownArgument(name)
        if isinstance(value, Ref):
            target = self._wiring.components.get(value.target)
            if not value.eager or target is None:
                raise UnknownArgument(name)
            resolved: Any = ArgumentView(self._wiring, target, self._depth + 1)
            for attribute in value.attrs:
                resolved = getattr(resolved, attribute)
            return resolved
        if next(iter_refs(value), None) is not None:
            raise UnknownArgument(name)
        return value


def run_argument_checks(
    wiring: Wiring, skip: set[str], add: Callable[[ComponentSpec, str | None, str, str], None]
) -> None:
    """Run ``check_arguments`` of every component not in ``skip`` (components whose arguments
    already failed); each problem goes to ``add(spec, key, path, message)``."""
    for spec in wiring.components.values():
        check = getattr(spec.cls, "check_arguments", None)
        if spec.name in skip or check is None:
            continue
        try:
            check(ArgumentView(wiring, spec))
        except UnknownArgument:
            continue
        except ArgumentError as exc:
            add(spec, spec.located_key(exc.argument), f".args.{exc.argument}", str(exc))
        except (ValueError, TypeError) as exc:
            add(spec, None, "", str(exc))
