"""The component library's name table: every component declared where it lives, and every
eager edge of the shipped wirings typed."""

from __future__ import annotations

import importlib
import typing
from pathlib import Path

import attrs
import pytest

import schedkit.components
from schedkit import load_wiring
from schedkit.core.component import component_name, is_component, lookup

ROOT = Path(__file__).resolve().parents[2]
LIBRARY_MODULES = [
    "schedkit.components." + ".".join(p.relative_to(ROOT / "components").with_suffix("").parts)
    for p in sorted((ROOT / "components").rglob("*.py"))
    if p.name != "__init__.py"
] + ["schedkit.core.parallel_state", "schedkit.runner.model_runner"]


def _components_in(module_name: str) -> dict[str, type]:
    module = importlib.import_module(module_name)
    return {
        component_name(obj): obj
        for obj in vars(module).values()
        if is_component(obj) and obj.__module__ == module_name
    }


@pytest.mark.parametrize("module_name", LIBRARY_MODULES)
def test_every_component_is_declared_under_its_module(module_name):
    for name, cls in _components_in(module_name).items():
        assert schedkit.components.COMPONENT_MODULES.get(name) == module_name, name
        assert lookup(name) is cls


def test_every_declared_name_resolves_to_a_component_of_its_module():
    for name, module_name in schedkit.components.COMPONENT_MODULES.items():
        assert name in _components_in(module_name), (name, module_name)


@pytest.mark.parametrize(
    "overlays",
    [(), ("examples/serve.yaml",), ("examples/swa.yaml",), ("examples/hicache.yaml",)],
    ids=str,
)
def test_no_eager_edge_of_a_shipped_wiring_is_typed_any(overlays):
    wiring = load_wiring(ROOT / "wiring.yaml", *(ROOT / o for o in overlays))
    untyped = []
    for name, spec in wiring.components.items():
        if spec.cls is None:
            continue
        hints = typing.get_type_hints(spec.cls)
        for field in attrs.fields(spec.cls):
            value = spec.args.get(field.alias)
            eager = getattr(value, "eager", False)
            if eager and hints.get(field.name, typing.Any) in (typing.Any, object):
                untyped.append(f"{name}.{field.alias}")
    assert untyped == []
