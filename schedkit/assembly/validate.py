"""Validation of a merged wiring against the component classes, before anything is built.

Every problem is collected (never just the first) as ``FILE:LINE: components.<name>.args.<key>:
<what is wrong>; <what would be valid>``. What a ``type`` names is resolved in
``component_types``, each component checked against its class in ``spec_checker`` (what a
field's type asks of a value in ``conformance``), the eager-reference graph in ``wiring_graph``.
"""

from __future__ import annotations

from dependency_injector import containers

from schedkit.assembly.argument_checks import run_argument_checks
from schedkit.assembly.component_types import import_plugin, resolve_type
from schedkit.assembly.conformance import protocol_members
from schedkit.assembly.spec_checker import SpecChecker
from schedkit.assembly.wiring import Wiring, iter_refs
from schedkit.assembly.wiring_graph import eager_edges, find_cycles, topological_order
from schedkit.core.component import load_entry_points

__all__ = [
    "eager_edges",
    "find_cycles",
    "import_plugin",
    "iter_refs",
    "protocol_members",
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
    checker = SpecChecker(wiring)
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
