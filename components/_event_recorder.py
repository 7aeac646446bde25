"""KV-cache event recording shared by the radix caches.

A cache that publishes events owns one ``EventRecorder``: it hashes the pages of new tree
nodes and queues ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` until the scheduler
takes them. A cache with events off has no recorder and does no hashing at all.

The queue coalesces as SGLang's does: a ``BlockStored`` whose parent is the last page of the
``BlockStored`` at the queue's tail (same medium, LoRA, block size and namespace) extends it,
and consecutive ``BlockRemoved`` of one medium merge.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedkit.kv_events.hashing import chain_pages, namespace_seed, namespaced_hash
from schedkit.kv_events.structs import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored

__all__ = ["EventRecorder"]


class EventRecorder:
    """Hashes pages into a chain and queues the cache's KV events, coalesced."""

    __slots__ = ("_queue", "page_size")

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._queue: list = []

    def hash_pages(
        self,
        token_ids: Sequence[int],
        parent_digest: bytes | None,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> tuple[list[bytes], list[int]]:
        """The chained 32-byte digests of every full page of ``token_ids`` and the hashes
        events carry for them (namespaced when ``extra_key`` or ``cache_salt`` is given)."""
        digests, hashes = chain_pages(token_ids, self.page_size, parent_digest)
        if extra_key is None and cache_salt is None:
            return digests, hashes
        seed = namespace_seed(extra_key, cache_salt)
        return digests, [namespaced_hash(seed, h) for h in hashes]

    def stored(
        self,
        token_ids: list[int],
        hashes: list[int],
        parent_hash: int | None,
        cache_salt: str | None = None,
    ) -> None:
        """Queue the pages of one new node (``token_ids`` holds whole pages), linked to the
        page before them. The event shares the node's lists until it is extended."""
        queue = self._queue
        tail = queue[-1] if queue else None
        if (
            type(tail) is BlockStored
            and parent_hash is not None
            and tail.block_hashes[-1] == parent_hash
            and tail.cache_salt == cache_salt
        ):
            # New lists: the ones the event had may be a node's own.
            tail.block_hashes = tail.block_hashes + hashes
            tail.token_ids = tail.token_ids + token_ids
            return
        queue.append(
            BlockStored(
                hashes, parent_hash, token_ids, self.page_size, None, MEDIUM_GPU, cache_salt
            )
        )

    def removed(self, hashes: list[int]) -> None:
        """Queue the withdrawal of a removed node's pages."""
        queue = self._queue
        tail = queue[-1] if queue else None
        if type(tail) is BlockRemoved:
            tail.block_hashes = tail.block_hashes + hashes
        else:
            queue.append(BlockRemoved(hashes, MEDIUM_GPU))

    def cleared(self) -> None:
        """Queue ``AllBlocksCleared``."""
        self._queue.append(AllBlocksCleared())

    def take(self) -> list:
        """The queued events, oldest first; the queue starts over empty."""
        events = self._queue
        self._queue = []
        return events
