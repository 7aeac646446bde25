"""KV-cache event recording shared by the radix caches.

A cache that publishes events owns one ``EventRecorder``: it hashes the pages of new tree
nodes and queues ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` until the scheduler
takes them. A cache with events off has no recorder and does no hashing at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedkit.kv_events.hashing import page_digests
from schedkit.kv_events.structs import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored

__all__ = ["EventRecorder"]


class EventRecorder:
    """Hashes pages into a chain seeded by ``namespace`` and queues the cache's KV events."""

    __slots__ = ("_queue", "namespace", "page_size")

    def __init__(self, page_size: int, namespace: str | None = None) -> None:
        self.page_size = page_size
        self.namespace = namespace
        self._queue: list = []

    def digests(self, token_ids: Sequence[int], parent_digest: bytes | None) -> list[bytes]:
        """The 32-byte digest of every full page of ``token_ids``, chained from the parent page."""
        return page_digests(token_ids, self.page_size, parent_digest, self.namespace)

    def stored(
        self, token_ids: list[int], digests: list[bytes], parent_digest: bytes | None
    ) -> None:
        """Queue one ``BlockStored`` per page, in order, each linked to the page before it."""
        page_size = self.page_size
        from_bytes = int.from_bytes
        parent = (
            None if parent_digest is None else from_bytes(parent_digest[:8], "big", signed=True)
        )
        append = self._queue.append
        start = 0
        for digest in digests:
            block_hash = from_bytes(digest[:8], "big", signed=True)
            page = token_ids[start : start + page_size]
            append(BlockStored([block_hash], parent, page, page_size, None, MEDIUM_GPU))
            parent = block_hash
            start += page_size

    def removed(self, digests: list[bytes]) -> None:
        """Queue one ``BlockRemoved`` carrying the hashes of a removed node's pages."""
        hashes = [int.from_bytes(d[:8], "big", signed=True) for d in digests]
        self._queue.append(BlockRemoved(hashes, MEDIUM_GPU))

    def cleared(self) -> None:
        """Queue ``AllBlocksCleared``."""
        self._queue.append(AllBlocksCleared())

    def take(self) -> list:
        """The queued events, oldest first; the queue starts over empty."""
        events = self._queue
        self._queue = []
        return events
