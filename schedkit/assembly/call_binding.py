"""``!call`` arguments pointed straight at their targets' bound methods once an assembly is
built, so hot paths call a plain attribute instead of a forwarding closure.

A ``!call`` argument is first given a closure (``late_binding``) that reads its target's cell
at every call. Once every component is built, ``CallBindings.bind`` replaces each closure a
component kept as given by the bound method the closure would call now; ``unbind`` puts the
closures back (``Assembly.override`` does for the duration of its block, so that calls reach
the fakes, and binds again after).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

__all__ = ["CallBindings"]


class CallBindings:
    """The ``!call`` arguments of an assembly's built components, bound or not."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        # [instance, argument, closure, cell, getter, bound method set or None] per argument.
        self._entries: list[list] = []

    def add(
        self,
        instance: Any,
        argument: str,
        closure: Callable,
        cell: list,
        attributes: tuple[str, ...],
    ) -> None:
        """Record that ``instance.argument`` was given ``closure``, which calls
        ``cell[0].<attributes>``."""
        getter = attrgetter(".".join(attributes))
        self._entries.append([instance, argument, closure, cell, getter, None])

    def bind(self) -> None:
        """Point each recorded argument, where its component still holds the closure, at the
        bound method the closure would call now."""
        for entry in self._entries:
            instance, argument, closure, cell, getter, _ = entry
            if getattr(instance, argument, None) is not closure:
                continue  # the component keeps it elsewhere, or it was replaced
            try:
                bound = getter(cell[0])
            except AttributeError:
                continue  # the closure raises it when called, naming the reference
            object.__setattr__(instance, argument, bound)
            entry[5] = bound

    def unbind(self) -> None:
        """Put back the closures that ``bind`` replaced (and nobody replaced since)."""
        for entry in self._entries:
            instance, argument, closure, _, _, bound = entry
            if bound is not None and getattr(instance, argument, None) is bound:
                object.__setattr__(instance, argument, closure)
            entry[5] = None
