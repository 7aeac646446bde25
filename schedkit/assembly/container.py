"""Building a validated wiring with dependency-injector, and the resulting ``Assembly``.

Each component gets one ``Resource`` provider in a ``DynamicContainer``: it builds the component
once and stops it (``shutdown()`` or ``close()``) when ``shutdown_resources()`` reaches it, after
every component that takes it eagerly. Eager ``!ref``s inject the target's provider (or its
``.provided`` attribute), so overriding a provider reaches them when their component is built.

``!late``/``!call`` inject a closure (``late_binding``) over the target's *cell*: a one-item
list the assembly keeps pointing at the component's current instance (the built one, a build
override, or the fake of an ``Assembly.override`` block). The scheduler calls these
every step, so the cell is read directly: resolving the provider at each call instead cost
about 3% of a W1 run, and dependency-injector's ``.provided`` getter about five times that.
Once every component is built, a ``!call`` argument that a component kept as given is
pointed straight at its target's bound method (``call_binding``), so hot paths call a plain
attribute; an ``Assembly.override`` block puts the closures back for its duration and binds
again after. Each component's Resource (build, cell, stop, injected arguments) is made in
``component_resources``.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dependency_injector import containers, providers

from schedkit.assembly.call_binding import CallBindings
from schedkit.assembly.component_resources import (
    ComponentBuildError,
    NotBuilt,
    component_lifecycle,
    injection,
)
from schedkit.assembly.loading import load_wiring
from schedkit.assembly.validate import validate
from schedkit.assembly.wiring import Ref, Wiring, WiringError
from schedkit.assembly.wiring_graph import eager_edges, topological_order

__all__ = ["Assembly", "ComponentBuildError", "build"]

# Called with every Assembly that build() returns. schedkit.testing's leak check adds a hook
# here to find the assemblies a test never shut down.
build_hooks: list[Callable[[Assembly], None]] = []


class Assembly:
    """The built components of a wiring, by name.

    ``assembly[name]`` is the shared instance; ``override(name=fake)`` swaps components for the
    duration of a ``with`` block; ``shutdown()`` stops every component, dependents first.
    """

    def __init__(
        self,
        wiring: Wiring,
        container: containers.DynamicContainer,
        edges: dict[str, list[str]],
    ) -> None:
        self.wiring = wiring
        self.container = container
        self.order = topological_order(edges)
        self._edges = edges
        self._cells: dict[str, list] = {name: [NotBuilt(name)] for name in wiring.components}
        self._shutdown_errors: list[Exception] = []
        self._shut_down = False
        self._calls = CallBindings()

    def __getitem__(self, name: str) -> Any:
        if self._shut_down:  # the instances that ran, as the cells still hold them
            cell = self._cells.get(name)
            if cell is None or type(cell[0]) is NotBuilt:
                raise WiringError(_unknown(name, self.wiring))
            return cell[0]
        return self._provider(name)()

    def __contains__(self, name: object) -> bool:
        return name in self.wiring.components

    def names(self) -> list[str]:
        """Component names in build order."""
        return list(self.order)

    @property
    def is_shut_down(self) -> bool:
        """True once ``shutdown()`` has run."""
        return self._shut_down

    def _provider(self, name: str) -> providers.Resource:
        try:
            return self.container.providers[name]
        except KeyError:
            raise WiringError(_unknown(name, self.wiring)) from None

    @contextlib.contextmanager
    def override(self, **fakes: Any) -> Iterator[Assembly]:
        """Swap components for ``fakes`` within a ``with`` block.

        Components that take an overridden one eagerly are rebuilt against the fake for the
        block (and shut down after it); late references see the fake until the block ends.
        """
        overridden = [self._provider(n) for n in fakes]
        dependents = self._dependents(set(fakes))
        self._calls.unbind()  # late calls must reach the fakes in the block
        cells = self._cells
        before = {name: cells[name][0] for name in [*fakes, *dependents]}
        for provider, (name, fake) in zip(overridden, fakes.items(), strict=True):
            provider.override(providers.Object(fake))
            cells[name][0] = fake
        rebuilt = []
        for name in dependents:
            original = self._provider(name)
            rebuilt.append(providers.Resource(original.provides, *original.args, **original.kwargs))
            original.override(rebuilt[-1])
            overridden.append(original)
        try:
            for resource in rebuilt:
                resource()
            yield self
        finally:
            for resource in reversed(rebuilt):
                resource.shutdown()
            for provider in overridden:
                provider.reset_last_overriding()
            for name, instance in before.items():
                cells[name][0] = instance
            self._calls.bind()
            self._raise_shutdown_error()

    def _dependents(self, names: set[str]) -> list[str]:
        affected = set()
        for name in self.order:  # build order: dependencies come before their dependents
            if name not in names and any(d in names or d in affected for d in self._edges[name]):
                affected.add(name)
        return [n for n in self.order if n in affected]

    def shutdown(self) -> None:
        """Call ``shutdown()`` (or ``close()``) on every built component once, each before the
        components it references eagerly. Errors are logged and the first is raised after all
        have run."""
        if self._shut_down:
            return
        self._shut_down = True
        self.container.shutdown_resources()
        self._raise_shutdown_error()

    def _raise_shutdown_error(self) -> None:
        errors, self._shutdown_errors[:] = list(self._shutdown_errors), []
        if errors:
            raise errors[0]

    def __enter__(self) -> Assembly:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def _unknown(name: str, wiring: Wiring) -> str:
    close = difflib.get_close_matches(name, wiring.components, n=1)
    names = ", ".join(wiring.components) or "none"
    hint = f"did you mean {close[0]}?" if close else f"components: {names}"
    where = f" in {', '.join(wiring.sources)}" if wiring.sources else ""
    return f"unknown component {name!r}{where}; {hint}"


def build(wiring: Wiring | Mapping, overrides: Mapping[str, object] | None = None) -> Assembly:
    """Build every component of ``wiring`` (validating it first if needed).

    ``overrides`` maps component names to objects that stand in for them: the real component
    is not constructed, and every reference to it, eager or late, gets the override.
    """
    if isinstance(wiring, Mapping):
        wiring = load_wiring(wiring)
    elif not wiring.validated:
        errors = validate(wiring)
        if errors:
            raise WiringError(errors)
    overrides = dict(overrides or {})
    unknown = [_unknown(n, wiring) for n in overrides if n not in wiring.components]
    if unknown:
        raise WiringError(unknown)

    edges = eager_edges(wiring)
    container = containers.DynamicContainer()
    assembly = Assembly(wiring, container, edges)
    order = assembly.order
    for name in order:
        container.set_provider(
            name,
            providers.Resource(
                component_lifecycle(
                    wiring.components[name], assembly._cells[name], assembly._shutdown_errors
                )
            ),
        )
    calls = []  # (component, argument, closure, target cell, attribute path)
    for name in order:
        resource = container.providers[name]
        resource.add_args(*(container.providers[d] for d in dict.fromkeys(edges[name])))
        args = wiring.components[name].args
        injected = {k: injection(v, container, assembly._cells) for k, v in args.items()}
        resource.add_kwargs(**injected)
        for k, v in args.items():
            if isinstance(v, Ref) and v.kind == "call" and name not in overrides:
                calls.append((name, k, injected[k].provides, assembly._cells[v.target], v.attrs))
    for name, obj in overrides.items():
        container.providers[name].override(providers.Object(obj))
        assembly._cells[name][0] = obj
    try:
        for name in order:
            container.providers[name]()
    except BaseException:
        with contextlib.suppress(Exception):
            assembly.shutdown()
        raise
    for name, argument, closure, cell, attributes in calls:
        assembly._calls.add(assembly._cells[name][0], argument, closure, cell, attributes)
    assembly._calls.bind()
    for hook in build_hooks:
        hook(assembly)
    return assembly
