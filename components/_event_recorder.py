"""KV-cache event recording shared by the radix caches.

A cache that publishes events owns one ``EventRecorder``: it hashes the pages of new tree
nodes and queues ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` until the scheduler
takes them. A cache with events off has no recorder and does no hashing at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedkit.kv_events.hashing import digest_to_int, page_digests
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
        parent = None if parent_digest is None else digest_to_int(parent_digest)
        queue = self._queue
        for i, digest in enumerate(digests):
            block_hash = digest_to_int(digest)
            page = token_ids[i * page_size : (i + 1) * page_size]
            queue.append(
                BlockStored(
                    block_hashes=[block_hash],
                    parent_block_hash=parent,
                    token_ids=page,
                    block_size=len(page),
                    lora_id=None,
                    medium=MEDIUM_GPU,
                )
            )
            parent = block_hash

    def removed(self, digests: list[bytes]) -> None:
        """Queue one ``BlockRemoved`` carrying the hashes of a removed node's pages."""
        hashes = [digest_to_int(d) for d in digests]
        self._queue.append(BlockRemoved(block_hashes=hashes, medium=MEDIUM_GPU))

    def cleared(self) -> None:
        """Queue ``AllBlocksCleared``."""
        self._queue.append(AllBlocksCleared())

    def take(self) -> list:
        """The queued events, oldest first; the queue starts over empty."""
        events = self._queue
        self._queue = []
        return events
