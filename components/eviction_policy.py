"""Which unlocked leaf a prefix cache evicts first: SGLang's eviction strategies as sort keys
over tree nodes (smallest key goes first).

- ``lru``: least recently used (the default);
- ``lfu``: fewest prefix-cache hits, then least recently used;
- ``fifo``: inserted first;
- ``priority``: lowest request priority (the highest of the requests that stored or reused
  the node), then least recently used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

__all__ = ["EVICTION_POLICIES", "EvictionPolicy"]

EvictionPolicy = Literal["lru", "lfu", "fifo", "priority"]

EVICTION_POLICIES: dict[str, Callable[[Any], Any]] = {
    "lru": lambda node: node.last_access_time,
    "lfu": lambda node: (node.hit_count, node.last_access_time),
    "fifo": lambda node: node.created,
    "priority": lambda node: (node.priority, node.last_access_time),
}
