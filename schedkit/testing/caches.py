"""Reading a prefix cache's contents in the terms its KV events use."""

from __future__ import annotations

from typing import Any

__all__ = ["cache_page_hashes"]


def cache_page_hashes(cache: Any) -> set[int]:
    """Every published page hash a radix cache (with events on) holds, read from its tree
    (namespaced hashes for namespaced keys): what a consumer replaying the cache's events must
    end up with."""
    held: set[int] = set()
    stack = list(cache.root.children.values())
    while stack:
        node = stack.pop()
        held.update(node.hashes)
        stack.extend(node.children.values())
    return held
