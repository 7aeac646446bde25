"""Building a validated wiring with dependency-injector, and the resulting ``Assembly``.

Each component gets one ``Singleton`` provider in a ``DynamicContainer``. Eager ``!ref``s inject
the target's provider; ``!late``/``!call`` inject a small closure over the target's provider, so
that the target is looked up when the closure is called (an override of the target is seen).
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import structlog
from dependency_injector import containers, providers

from schedkit.late_binding import late_binding
from schedkit.validate import eager_edges, topological_order, validate
from schedkit.wiring import ComponentSpec, Ref, Wiring, WiringError

__all__ = ["Assembly", "ComponentBuildError", "build"]

log = structlog.get_logger("schedkit.container")

# Called with every Assembly that build() returns. schedkit.testing's leak check adds a hook
# here to find the assemblies a test never shut down.
build_hooks: list[Callable[[Assembly], None]] = []


class ComponentBuildError(WiringError):
    """A component's constructor raised; names the component and its wiring entry."""


class Assembly:
    """The built components of a wiring, by name.

    ``assembly[name]`` is the shared instance; ``override(name=fake)`` swaps components for the
    duration of a ``with`` block; ``shutdown()`` stops components in reverse build order.
    """

    def __init__(
        self, wiring: Wiring, container: containers.DynamicContainer, order: list[str]
    ) -> None:
        self.wiring = wiring
        self.container = container
        self.order = order
        self._built: list[tuple[str, Any]] = []
        self._edges = eager_edges(wiring)
        self._shut = False

    def __getitem__(self, name: str) -> Any:
        return self._provider(name)()

    def __contains__(self, name: object) -> bool:
        return name in self.wiring.components

    def names(self) -> list[str]:
        """Component names in build order."""
        return list(self.order)

    def _provider(self, name: str) -> providers.Singleton:
        try:
            return self.container.providers[name]
        except KeyError:
            raise WiringError(_unknown(name, self.wiring)) from None

    def _record(self, name: str, instance: Any) -> None:
        self._built.append((name, instance))

    @contextlib.contextmanager
    def override(self, **fakes: Any) -> Iterator[Assembly]:
        """Swap components for ``fakes`` within a ``with`` block.

        Components that take an overridden one eagerly are rebuilt against the fake for the
        block (and shut down after it); late references see the fake through the container.
        """
        for name in fakes:
            self._provider(name)
        overridden = [self._provider(n) for n in fakes]
        for name, fake in fakes.items():
            self._provider(name).override(providers.Object(fake))
        dependents = self._dependents(set(fakes))
        for name in dependents:
            original = self._provider(name)
            original.override(providers.Singleton(original.provides, **original.kwargs))
            overridden.append(original)
        start = len(self._built)
        try:
            for name in dependents:
                self[name]
            yield self
        finally:
            temporary, self._built[start:] = self._built[start:], []
            _shutdown_all(reversed(temporary))
            for provider in overridden:
                provider.reset_last_overriding()

    def _dependents(self, names: set[str]) -> list[str]:
        affected = set()
        for name in self.order:  # build order: dependencies come before their dependents
            if name not in names and any(d in names or d in affected for d in self._edges[name]):
                affected.add(name)
        return [n for n in self.order if n in affected]

    def shutdown(self) -> None:
        """Call ``shutdown()`` (or ``close()``) on every built component, in reverse build
        order, once. Errors are logged and the first is raised after all have run."""
        if self._shut:
            return
        self._shut = True
        built, self._built = self._built, []
        _shutdown_all(reversed(built))

    def __enter__(self) -> Assembly:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def _shutdown_all(components: Iterator[tuple[str, Any]]) -> None:
    first_error = None
    for name, instance in components:
        stop = getattr(instance, "shutdown", None) or getattr(instance, "close", None)
        if not callable(stop):
            continue
        try:
            stop()
        except Exception as exc:
            log.error("component shutdown failed", component=name, error=str(exc))
            first_error = first_error or exc
    if first_error is not None:
        raise first_error


def _unknown(name: str, wiring: Wiring) -> str:
    close = difflib.get_close_matches(name, wiring.components, n=1)
    hint = f"did you mean {close[0]}?" if close else f"components: {', '.join(wiring.components)}"
    return f"unknown component {name!r}; {hint}"


def _factory(spec: ComponentSpec, assembly: Assembly) -> Callable[..., Any]:
    cls, name = spec.cls, spec.name

    def construct(**kwargs: Any) -> Any:
        try:
            instance = cls(**kwargs)
        except Exception as exc:
            raise ComponentBuildError(
                f"{spec.where()}: components.{name}: {cls.__name__}(...) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        assembly._record(name, instance)
        return instance

    construct.__qualname__ = construct.__name__ = f"build {name}"
    return construct


def _injection(value: Any, container: containers.DynamicContainer) -> Any:
    if isinstance(value, Ref):
        target = container.providers[value.target]
        label = str(value).split(" ", 1)[1]
        if value.kind == "late":
            return providers.Object(late_binding("late", target, value.attrs, label))
        if value.kind == "call":
            return providers.Object(late_binding("call", target, value.attrs, label))
        for attribute in value.attrs:
            target = getattr(target.provided, attribute)
        return target
    if isinstance(value, list) and any(isinstance(v, (Ref, list, dict)) for v in value):
        return providers.List(*(_injection(v, container) for v in value))
    if isinstance(value, dict) and any(isinstance(v, (Ref, list, dict)) for v in value.values()):
        return providers.Dict({k: _injection(v, container) for k, v in value.items()})
    return value


def build(wiring: Wiring | Mapping, overrides: Mapping[str, object] | None = None) -> Assembly:
    """Build every component of ``wiring`` (validating it first if needed).

    ``overrides`` maps component names to objects that stand in for them: the real component
    is not constructed, and every reference to it, eager or late, gets the override.
    """
    if isinstance(wiring, Mapping):
        from schedkit.wiring import load_wiring

        wiring = load_wiring(wiring)
    elif not wiring.validated:
        errors = validate(wiring)
        if errors:
            raise WiringError(errors)
    overrides = dict(overrides or {})
    unknown = [_unknown(n, wiring) for n in overrides if n not in wiring.components]
    if unknown:
        raise WiringError(unknown)

    order = topological_order(eager_edges(wiring))
    container = containers.DynamicContainer()
    assembly = Assembly(wiring, container, order)
    for name in order:
        container.set_provider(
            name, providers.Singleton(_factory(wiring.components[name], assembly))
        )
    for name in order:
        kwargs = {k: _injection(v, container) for k, v in wiring.components[name].args.items()}
        container.providers[name].add_kwargs(**kwargs)
    for name, obj in overrides.items():
        container.providers[name].override(providers.Object(obj))
    try:
        for name in order:
            container.providers[name]()
    except BaseException:
        with contextlib.suppress(Exception):
            assembly.shutdown()
        raise
    for hook in build_hooks:
        hook(assembly)
    return assembly
