"""What a wiring's ``type`` names: a registered component, or a ``module:Class`` from a module
the wiring lists as a plugin (or one advertised under the components entry point)."""

from __future__ import annotations

import difflib
import importlib
import traceback
from collections.abc import Collection

from schedkit.core.component import (
    entry_point_modules,
    is_component,
    lookup,
    registered_names,
)

__all__ = ["import_plugin", "resolve_type"]


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
    if not all(part.isidentifier() for part in module.split(".")):
        return (
            f"cannot import {module!r}: a plugin is an absolute module name, dotted Python "
            "identifiers such as my_package.components"
        )
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
