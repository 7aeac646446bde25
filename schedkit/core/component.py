"""The component model: ``@component`` turns a class into a slotted, keyword-only attrs class
and registers it under a short name so that a wiring file can refer to it.

Components know nothing of the container: a component class is usable with plain keyword
arguments, and this module imports nothing from the wiring or container modules.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, TypeVar, overload

import attrs

__all__ = [
    "ENTRY_POINT_GROUP",
    "ArgumentError",
    "ComponentRegistrationError",
    "UnknownArgument",
    "at_least",
    "component",
    "component_name",
    "declare_modules",
    "entry_point_modules",
    "is_component",
    "load_entry_points",
    "lookup",
    "registered",
    "registered_names",
]

ENTRY_POINT_GROUP = "schedkit.components"

C = TypeVar("C", bound=type)

_REGISTRY: dict[str, type] = {}
# Components declared by name before their module is imported: name -> module.
_DECLARED: dict[str, str] = {}
_MARK = "__schedkit_component__"
_entry_points_loaded = False
_entry_point_modules: set[str] = set()


class ArgumentError(ValueError):
    """A component's arguments are inconsistent; ``argument`` names the one to change.

    Raised by a component's ``check_arguments(args)`` classmethod, which looks only at argument
    values (``args.name``), never builds anything: ``__attrs_post_init__`` runs it on the
    instance, and ``schedkit validate`` runs it on the wiring's values before anything is
    built (a value it cannot know before build, such as another component's computed state,
    raises ``UnknownArgument``, and the check is left to build time).
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


class UnknownArgument(Exception):
    """Raised when a cross-argument check reads a value only a build would know."""


class ComponentRegistrationError(Exception):
    """Two different classes claimed one component name, or a plugin could not be loaded."""


def _snake_case(name: str) -> str:
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def _qualified(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _register(cls: type, name: str) -> None:
    existing = _REGISTRY.get(name)
    # Re-importing the same module (e.g. under test reloaders) re-registers the same class path.
    if existing is not None and _qualified(existing) != _qualified(cls):
        raise ComponentRegistrationError(
            f"component name {name!r} is claimed by both {_qualified(existing)} and "
            f"{_qualified(cls)}; give one of them another name with @component('other_name')"
        )
    _REGISTRY[name] = cls


def _make_component(cls: type, name: str | None, frozen: bool) -> type:
    name = name or _snake_case(cls.__name__)
    # Validators run when the component is built; later assignments (counters on hot paths)
    # stay plain attribute writes. Frozen classes refuse assignments anyway.
    on_setattr = {} if frozen else {"on_setattr": attrs.setters.NO_OP}
    new_cls = attrs.define(cls, slots=True, kw_only=True, frozen=frozen, **on_setattr)
    setattr(new_cls, _MARK, name)
    _register(new_cls, name)
    return new_cls


@overload
def component(cls: C, /) -> C: ...
@overload
def component(name: str | None = None, /, *, frozen: bool = False) -> Callable[[C], C]: ...


def component(name_or_cls: Any = None, /, *, frozen: bool = False) -> Any:
    """Declare a scheduler component.

    Use bare (``@component``) or with a name and options (``@component("radix_cache",
    frozen=True)``). The class becomes an attrs class with ``slots=True, kw_only=True`` and is
    registered under ``name`` (default: the class name in snake_case). Field validators run at
    construction, not on later assignments.
    """
    if isinstance(name_or_cls, type):
        return _make_component(name_or_cls, None, frozen)
    if name_or_cls is not None and not isinstance(name_or_cls, str):
        raise TypeError("@component takes a name string, e.g. @component('radix_cache')")

    def decorate(cls: C) -> C:
        return _make_component(cls, name_or_cls, frozen)

    return decorate


def at_least(minimum: int) -> Callable[[Any, attrs.Attribute, Any], None]:
    """A field validator: the value must be an integer >= ``minimum``. Validation of a wiring
    runs it on literal arguments, so ``schedkit validate`` reports a bad value before build."""

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{attribute.alias} must be an integer >= {minimum}, got {value!r}")

    return check


def is_component(obj: object) -> bool:
    """True when ``obj`` is a class declared with ``@component``."""
    return isinstance(obj, type) and _MARK in obj.__dict__


def component_name(cls: type) -> str:
    """The registered name of a component class."""
    return cls.__dict__[_MARK]


def load_entry_points(refresh: bool = False) -> list[str]:
    """Import every module advertised under the ``schedkit.components`` entry-point group.

    Runs once per process unless ``refresh`` (for newly installed distributions); returns the
    errors of entry points that failed to load (each naming the entry point) so that callers
    can report them instead of crashing.
    """
    global _entry_points_loaded
    if _entry_points_loaded and not refresh:
        return []
    _entry_points_loaded = True
    errors = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        _entry_point_modules.add(ep.module)
        try:
            ep.load()
        except Exception as exc:
            errors.append(f"entry point {ep.name} = {ep.value!r} failed to load: {exc}")
    return errors


def entry_point_modules() -> frozenset[str]:
    """The modules advertised under the ``schedkit.components`` entry-point group."""
    load_entry_points()
    return frozenset(_entry_point_modules)


def declare_modules(table: dict[str, str]) -> None:
    """Declare components by name without importing them: ``table`` maps a component name to
    the module that registers it, imported the first time the name is looked up."""
    _DECLARED.update(table)


def lookup(name: str) -> type | None:
    """The component class registered under ``name``, importing its declared module if
    needed; None for an unknown name (entry points loaded first)."""
    load_entry_points()
    cls = _REGISTRY.get(name)
    if cls is None and name in _DECLARED:
        importlib.import_module(_DECLARED[name])
        cls = _REGISTRY.get(name)
    return cls


def registered_names() -> list[str]:
    """Every component name known, imported or only declared, sorted (no module imported
    beyond the entry points)."""
    load_entry_points()
    return sorted({*_REGISTRY, *_DECLARED})


def registered() -> dict[str, type]:
    """The whole registry: component name -> class. Imports every declared module; use
    ``lookup`` for one name."""
    for name in registered_names():
        lookup(name)
    return dict(_REGISTRY)
