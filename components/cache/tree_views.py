"""What a prefix cache shows of itself: sizes, its root and KV events, and the introspection
SGLang's tests use (``introspection``). Mixed into ``RadixTree``."""

from __future__ import annotations

from typing import TextIO

from schedkit.components.cache.event_recorder import EventRecorder
from schedkit.components.cache.introspection import (
    all_values_flatten,
    available_and_evictable_str,
    pretty_print,
    sanity_check,
)
from schedkit.components.cache.tree_node import TreeNode

__all__ = ["TreeViews"]


class TreeViews:
    """Sizes, ``root_node``, ``kv_events`` and ``take_events``, and the introspection methods
    of a cache; reads the tree's ``root``, ``_events`` and size counters."""

    __slots__ = ()

    @property
    def root_node(self) -> TreeNode:
        """The tree's root (SGLang's name for ``root``)."""
        return self.root

    @property
    def kv_events(self) -> EventRecorder | None:
        """The recorder of the cache's KV events (its ``take()`` is ``take_events()``), None
        with events off (SGLang's ``BasePrefixCache.kv_events``)."""
        return self._events

    def take_events(self) -> list:
        """The KV events recorded since the last call, oldest first ([] with events off)."""
        return self._events.take() if self._events is not None else []

    def evictable_size(self) -> int:
        """Tokens held in unlocked nodes (full KV)."""
        return self._evictable_size

    def protected_size(self) -> int:
        """Tokens held in locked nodes (full KV)."""
        return self._protected_size

    def total_size(self) -> int:
        """Tokens held by the cache (full KV)."""
        return self._evictable_size + self._protected_size

    def pretty_print(self, file: TextIO | None = None) -> None:
        """Print the tree as SGLang's ``pretty_print`` (``introspection.pretty_print``)."""
        pretty_print(self, file)

    def all_values_flatten(self) -> list[int]:
        """Every cached KV slot, depth-first, as SGLang's ``all_values_flatten``."""
        return all_values_flatten(self)

    def available_and_evictable_str(self) -> str:
        """Free plus evictable slots, worded as SGLang's."""
        return available_and_evictable_str(self)

    def sanity_check(self) -> None:
        """Check the tree against the cache's counters (AssertionError naming a mismatch)."""
        sanity_check(self)
