"""Late binding: the zero-argument getters (``!late``) and forwarding callables (``!call``)
that a component receives for what changes at run time or lives on another component. The
container and ``schedkit.testing.isolate`` both bind through here."""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, Literal

__all__ = ["late_binding"]


def late_binding(
    kind: Literal["late", "call"], cell: list, attributes: tuple[str, ...], label: str
) -> Callable:
    """For ``late``, a getter of ``target.attr...`` (or the target itself) read when called;
    for ``call``, a callable that forwards its arguments to ``target.attr...``. The target is
    ``cell[0]``, read at every call: whoever owns the one-item list ``cell`` can replace the
    target (the container does while a component is overridden)."""
    if kind == "call":
        method = attrgetter(".".join(attributes))

        def forward(*args: Any, **kwargs: Any) -> Any:
            return method(cell[0])(*args, **kwargs)

        forward.__qualname__ = forward.__name__ = f"call {label}"
        return forward
    if not attributes:

        def get_component() -> Any:
            return cell[0]

        get_component.__qualname__ = get_component.__name__ = f"late {label}"
        return get_component
    getter = attrgetter(".".join(attributes))

    def get_value() -> Any:
        return getter(cell[0])

    get_value.__qualname__ = get_value.__name__ = f"late {label}"
    return get_value
