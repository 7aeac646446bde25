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
pointed straight at its target's bound method, so hot paths call a plain attribute; an
``Assembly.override`` block puts the closures back for its duration and binds again after.
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Callable, Iterator, Mapping
from operator import attrgetter
from typing import Any

import structlog
from dependency_injector import containers, providers

from schedkit.assembly.late_binding import late_binding
from schedkit.assembly.loading import load_wiring
from schedkit.assembly.validate import validate
from schedkit.assembly.wiring import ComponentSpec, Ref, Wiring, WiringError
from schedkit.assembly.wiring_graph import eager_edges, topological_order

__all__ = ["Assembly", "ComponentBuildError", "build"]

log = structlog.get_logger("schedkit.assembly.container")

# Called with every Assembly that build() returns. schedkit.testing's leak check adds a hook
# here to find the assemblies a test never shut down.
build_hooks: list[Callable[[Assembly], None]] = []


class ComponentBuildError(WiringError):
    """A component's constructor raised; names the component and its wiring entry."""


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
        self._cells: dict[str, list] = {name: [_NotBuilt(name)] for name in wiring.components}
        self._shutdown_errors: list[Exception] = []
        self._shut_down = False
        # [instance, argument, closure, cell, getter, bound method set or None] per !call
        # argument of a built component (``_bind_calls``).
        self._calls: list[list] = []

    def __getitem__(self, name: str) -> Any:
        if self._shut_down:  # the instances that ran, as the cells still hold them
            cell = self._cells.get(name)
            if cell is None or type(cell[0]) is _NotBuilt:
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
        self._unbind_calls()  # late calls must reach the fakes in the block
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
            self._bind_calls()
            self._raise_shutdown_error()

    def _bind_calls(self) -> None:
        """Point each recorded ``!call`` argument, where its component still holds the
        closure, at the bound method the closure would call now."""
        for entry in self._calls:
            instance, argument, closure, cell, getter, _ = entry
            if getattr(instance, argument, None) is not closure:
                continue  # the component keeps it elsewhere, or it was replaced
            try:
                bound = getter(cell[0])
            except AttributeError:
                continue  # the closure raises it when called, naming the reference
            object.__setattr__(instance, argument, bound)
            entry[5] = bound

    def _unbind_calls(self) -> None:
        """Put back the closures that ``_bind_calls`` replaced (and nobody replaced since)."""
        for entry in self._calls:
            instance, argument, closure, _, _, bound = entry
            if bound is not None and getattr(instance, argument, None) is bound:
                object.__setattr__(instance, argument, closure)
            entry[5] = None

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
    hint = f"did you mean {close[0]}?" if close else f"components: {', '.join(wiring.components)}"
    return f"unknown component {name!r}; {hint}"


class _NotBuilt:
    """What a component's cell holds until the component is built."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attribute: str) -> Any:
        raise WiringError(
            f"components.{self.name} is referenced late (!late / !call) and has not been built "
            "yet: a constructor cannot use a late reference to a component built after it"
        )


def _lifecycle(
    spec: ComponentSpec, cell: list, errors: list[Exception]
) -> Callable[..., Iterator[Any]]:
    """The Resource initializer of a component: build it, point its cell at it, hand it out,
    and stop it at shutdown.

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


def _injection(value: Any, assembly: Assembly) -> Any:
    if isinstance(value, Ref):
        target = assembly.container.providers[value.target]
        if value.kind in ("late", "call"):
            label = str(value).split(" ", 1)[1]
            cell = assembly._cells[value.target]
            return providers.Object(late_binding(value.kind, cell, value.attrs, label))
        for attribute in value.attrs:
            target = getattr(target.provided, attribute)
        return target
    if isinstance(value, list) and any(isinstance(v, (Ref, list, dict)) for v in value):
        return providers.List(*(_injection(v, assembly) for v in value))
    if isinstance(value, dict) and any(isinstance(v, (Ref, list, dict)) for v in value.values()):
        return providers.Dict({k: _injection(v, assembly) for k, v in value.items()})
    return value


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
                _lifecycle(
                    wiring.components[name], assembly._cells[name], assembly._shutdown_errors
                )
            ),
        )
    calls = []  # (component, argument, closure, target cell, attribute path)
    for name in order:
        resource = container.providers[name]
        resource.add_args(*(container.providers[d] for d in dict.fromkeys(edges[name])))
        args = wiring.components[name].args
        injected = {k: _injection(v, assembly) for k, v in args.items()}
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
        getter = attrgetter(".".join(attributes))
        assembly._calls.append([assembly._cells[name][0], argument, closure, cell, getter, None])
    assembly._bind_calls()
    for hook in build_hooks:
        hook(assembly)
    return assembly
