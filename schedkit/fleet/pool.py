"""What a worker's KV events may make a router's index hold: the worker's pool in pages."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedkit.assembly.container import Assembly
    from schedkit.components.io.kv_events_publisher import KvEventsPublisher

__all__ = ["pool_pages"]


def pool_pages(assembly: Assembly, publisher: KvEventsPublisher) -> int:
    """The pages a worker's KV events may hold at once: its device pool, and its host pool
    when it has one (HiCache stores pages there too)."""
    host = None
    if "tree_cache" in assembly:
        host = getattr(assembly["tree_cache"], "host_allocator", None)
    tokens = publisher.max_total_num_tokens + (0 if host is None else host.size)
    return max(1, tokens // publisher.page_size)
