"""The arguments every prefix cache shares, checked: the eviction policies (SGLang's
``evict_policy`` orders), the KV-event hash format and the pool a cache frees into."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.kv_events.hashing import check_hash_format

__all__ = ["EVICTION_POLICIES", "known_hash_format", "known_policy", "make_pool"]

EVICTION_POLICIES: dict[str, Callable[[Any], object]] = {
    "lru": lambda n: n.last_access_time,
    "lfu": lambda n: (n.hit_count, n.last_access_time),
    "fifo": lambda n: n.creation_time,
    "priority": lambda n: (n.priority, n.last_access_time),
}


def make_pool(
    allocator: TokenToKVPoolAllocator | None,
    capacity: int | None,
    page_size: int,
    names: tuple[str, str] = ("allocator", "capacity"),
) -> TokenToKVPoolAllocator:
    """The pool a cache frees into: the given allocator, or a new one of ``capacity`` slots."""
    allocator_name, capacity_name = names
    if allocator is None:
        if capacity is None:
            raise ValueError(
                f"the cache needs a KV pool: pass {allocator_name}=TokenToKVPoolAllocator(...) "
                f"or {capacity_name}=<number of token slots>"
            )
        return TokenToKVPoolAllocator(size=capacity, page_size=page_size)
    if capacity is not None:
        raise ValueError(f"pass either {allocator_name}= or {capacity_name}=, not both")
    stated = getattr(allocator, "page_size", page_size)  # a stand-in pool may not state it
    if isinstance(stated, int) and stated != page_size:
        raise ValueError(
            f"{allocator_name}.page_size is {allocator.page_size} but the cache's page_size "
            f"is {page_size}; they must match"
        )
    return allocator


def known_policy(instance: object, attribute: attrs.Attribute, value: object) -> None:
    """A field validator: ``value`` names one of ``EVICTION_POLICIES``."""
    if value not in EVICTION_POLICIES:
        raise ValueError(
            f"unknown eviction_policy {value!r}; valid: {', '.join(EVICTION_POLICIES)}"
        )


def known_hash_format(instance: object, attribute: attrs.Attribute, value: object) -> None:
    """A field validator: ``value`` is a KV-event hash format (``hashing.HASH_FORMATS``)."""
    check_hash_format(value)
