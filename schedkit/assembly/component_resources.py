"""Each component of an assembly as a dependency-injector ``Resource``: built once from its
wiring arguments (eager references as providers, late ones as closures over the target's
cell), its cell pointed at it, and stopped at shutdown."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import structlog
from dependency_injector import containers, providers

from schedkit.assembly.late_binding import late_binding
from schedkit.assembly.wiring import ComponentSpec, Ref, WiringError

__all__ = ["ComponentBuildError", "NotBuilt", "component_lifecycle", "injection"]

# The container's logger: its records name the container, which builds the resources.
log = structlog.get_logger("schedkit.assembly.container")


class ComponentBuildError(WiringError):
    """A component's constructor raised; names the component and its wiring entry."""


class NotBuilt:
    """What a component's cell holds until the component is built."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attribute: str) -> Any:
        raise WiringError(
            f"components.{self.name} is referenced late (!late / !call) and has not been built "
            "yet: a constructor cannot use a late reference to a component built after it"
        )


def component_lifecycle(
    spec: ComponentSpec, cell: list, errors: list[Exception]
) -> Callable[..., Iterator[Any]]:
    """The Resource initializer of a component: build it, point its cell at it, hand it out,
    and stop it at shutdown (an error stopping it is logged and appended to ``errors``).

    Positional arguments are the components it references eagerly; they are passed only so that
    ``shutdown_resources()`` sees them as related and stops this component first.
    """
    cls, name = spec.cls, spec.name

    def lifecycle(*_dependencies: Any, **kwargs: Any) -> Iterator[Any]:
        try:
            instance = cls(**kwargs)
        except Exception as exc:
            argument = getattr(exc, "argument", None) or _argument_named(spec, str(exc))
            path = f"components.{name}" + (f".args.{argument}" if argument else "")
            raise ComponentBuildError(
                f"{spec.where(argument)}: {path}: {cls.__name__}(...) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        cell[0] = instance
        yield instance
        stop = getattr(instance, "shutdown", None) or getattr(instance, "close", None)
        if callable(stop):
            try:
                stop()
            except Exception as exc:
                log.error("component shutdown failed", component=name, error=str(exc))
                errors.append(exc)

    lifecycle.__qualname__ = lifecycle.__name__ = f"build {name}"
    return lifecycle


def _argument_named(spec: ComponentSpec, message: str) -> str | None:
    """The wiring argument a constructor's error message starts with or names first."""
    found = [(message.find(arg), arg) for arg in spec.args if re.search(rf"\b{arg}\b", message)]
    return min(found)[1] if found else None


def injection(value: Any, container: containers.DynamicContainer, cells: dict[str, list]) -> Any:
    """What a Resource is given for the wiring argument ``value``: an eager ``!ref``'s target
    provider (or its ``.provided`` attribute), a late reference's closure over the target's
    cell, providers for lists and mappings holding references, the value itself otherwise."""
    if isinstance(value, Ref):
        target = container.providers[value.target]
        if value.kind in ("late", "call"):
            label = str(value).split(" ", 1)[1]
            cell = cells[value.target]
            return providers.Object(late_binding(value.kind, cell, value.attrs, label))
        for attribute in value.attrs:
            target = getattr(target.provided, attribute)
        return target
    if isinstance(value, list) and any(isinstance(v, (Ref, list, dict)) for v in value):
        return providers.List(*(injection(v, container, cells) for v in value))
    if isinstance(value, dict) and any(isinstance(v, (Ref, list, dict)) for v in value.values()):
        return providers.Dict({k: injection(v, container, cells) for k, v in value.items()})
    return value
