"""``isolate(name)``: build one component of a wiring with every neighbour replaced by a fake.

The component gets the arguments its wiring entry gives it. Each component it references
(``!ref``, ``!late`` or ``!call``) is replaced by ``fake(TheirClass, ...)`` holding their
configured values; the references are bound to the fakes the way the container would bind
them to the real components (``!call`` to the fake's recording method).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

import attrs

from schedkit import wirings
from schedkit.assembly.late_binding import late_binding
from schedkit.assembly.loading import load_wiring
from schedkit.assembly.validate import iter_refs
from schedkit.assembly.wiring import Ref, Wiring, WiringError
from schedkit.testing.fakes import fake

__all__ = ["Isolated", "isolate"]


@attrs.define(eq=False)
class Isolated:
    """The isolated ``component``, the ``fakes`` standing in for its neighbours (by component
    name) and the keyword ``arguments`` it was built with.

    ``shutdown()`` (or leaving a ``with`` block) stops the component if it has ``shutdown()``
    or ``close()``.
    """

    component: Any
    fakes: dict[str, Any]
    arguments: dict[str, Any]

    def shutdown(self) -> None:
        """Stop the component (``shutdown()`` or ``close()``), if it has either."""
        stop = getattr(self.component, "shutdown", None) or getattr(self.component, "close", None)
        if callable(stop):
            stop()

    def __enter__(self) -> Isolated:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


class _Fakes:
    """Fakes of a wiring's components, made on demand and shared.

    A fake gets its component's plain wiring arguments and the values of its eager
    references, read from the fakes of their targets (``page_size: !ref allocator.page_size``
    gives the allocator fake's page size). A value that cannot be read (a property without a
    value, a reference cycle) is left to the field's default.
    """

    def __init__(self, wiring: Wiring, given: Mapping[str, Any]) -> None:
        self.wiring = wiring
        self.made = dict(given)
        self.making: set[str] = set()

    def get(self, name: str) -> Any:
        if name in self.made:
            return self.made[name]
        if name in self.making:
            raise LookupError(name)
        self.making.add(name)
        spec = self.wiring.components[name]
        attributes = {}
        for key, value in spec.args.items():
            if isinstance(value, Ref):
                if value.eager:
                    try:
                        target = self.get(value.target)
                        attributes[key] = (
                            attrgetter(".".join(value.attrs))(target) if value.attrs else target
                        )
                    except (AttributeError, LookupError):
                        pass
            elif next(iter_refs(value), None) is None:
                attributes[key] = value
        self.made[name] = fake(spec.cls, **attributes)
        self.making.discard(name)
        return self.made[name]


def _bind(value: Any, fakes: dict[str, Any]) -> Any:
    if isinstance(value, Ref):
        target = fakes[value.target]
        if value.kind == "ref":
            return attrgetter(".".join(value.attrs))(target) if value.attrs else target
        return late_binding(value.kind, [target], value.attrs, str(value)[1:])
    if isinstance(value, list):
        return [_bind(v, fakes) for v in value]
    if isinstance(value, dict):
        return {k: _bind(v, fakes) for k, v in value.items()}
    return value


def isolate(
    name: str,
    /,
    source: str | os.PathLike | Mapping | Wiring | None = None,
    *,
    overlays: Sequence[str | os.PathLike | Mapping] = (),
    neighbours: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Isolated:
    """Build component ``name`` of ``source`` (+ ``overlays``) with fakes for its neighbours.

    ``source`` None is ``wiring.yaml`` in the working directory if there is one, else the
    wiring shipped with schedkit (as the ``schedkit`` command does).

    ``overrides`` replace constructor arguments of the component (its wiring's value, and any
    reference in it, is dropped). ``neighbours`` maps a neighbour's component name to the object
    to use instead of its fake (a real component, your own double). Returns an ``Isolated``:
    ``.component``, ``.fakes[neighbour_name]``, ``.arguments``.
    """
    if isinstance(source, Wiring):
        if overlays:
            raise TypeError("isolate(): overlays apply to a file or mapping, not a loaded Wiring")
        wiring = source
    else:
        wiring = load_wiring(wirings.default_source() if source is None else source, *overlays)
    spec = wiring.components.get(name)
    if spec is None:
        raise WiringError(
            f"isolate(): no component {name!r} in the wiring; components: "
            f"{', '.join(wiring.components)}"
        )
    valid = [f.alias for f in attrs.fields(spec.cls) if f.init]
    unknown = [key for key in overrides if key not in valid]
    if unknown:
        raise TypeError(
            f"isolate({name!r}): {spec.cls.__name__} has no argument "
            f"{', '.join(map(repr, unknown))}; valid arguments: {', '.join(valid)}"
        )
    args = {key: value for key, value in spec.args.items() if key not in overrides}
    targets = list(dict.fromkeys(r.target for v in args.values() for r in iter_refs(v)))
    neighbours = dict(neighbours or {})
    unused = sorted(set(neighbours) - set(targets))
    if unused:
        raise WiringError(
            f"isolate({name!r}): neighbours {', '.join(unused)} are not referenced by its "
            f"arguments; its neighbours: {', '.join(targets) or '(none)'}"
        )
    made = _Fakes(wiring, neighbours)
    fakes = {target: made.get(target) for target in targets}
    arguments = {key: _bind(value, fakes) for key, value in args.items()}
    arguments.update(overrides)
    return Isolated(spec.cls(**arguments), fakes, arguments)
