"""KV-cache event recording shared by the radix caches, as SGLang 0.5.23 records them.

A cache that publishes events owns one ``EventRecorder``. For each new tree node it hashes the
node's pages (the token bytes packed once, the whole node's SHA-256 chain in one call of
``page_chain``, native when built), keeps the digests and the published integer hashes on the
node, and queues one ``BlockStored`` for the whole node. A salted node under the root chains
from its salt's seed; ``hash_format`` (``sglang``, ``dynamo`` or ``vllm-sha256``) says which
chain is computed and how namespaced nodes publish it (``schedkit.kv_events.hashing``). Queued
events are coalesced: a ``BlockStored`` that continues the queue's last one (its parent is the
tail's last hash, same medium, LoRA, block size, salt and session) extends it, and consecutive
``BlockRemoved`` merge. The first merge into an event gives it lists of its own (until then
they are the node's), which later merges extend in place. A packed node (``array('I')`` key)
publishes its ``token_ids`` packed too (encoded as the same array of ints,
``schedkit.kv_events.packed_ids``); a merge of packed and list ids gives a list. A cache with
events off has no recorder and does no hashing at all.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable
from struct import Struct
from struct import error as struct_error
from typing import Any

from schedkit.components.cache.tree_node import as_list
from schedkit.kv_events.hashing import (
    check_hash_format,
    namespace_seed,
    namespaced_hash,
    salt_seed,
    vllm_page_digests,
)
from schedkit.kv_events.page_chain import chain_ids, chain_packed, pack_u32
from schedkit.kv_events.structs import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored

__all__ = ["EventRecorder"]

# A packed key (``array('I')``) is the hash input as it is on a little-endian machine.
_PACKED_IS_HASH_INPUT = sys.byteorder == "little" and array("I").itemsize == 4


class EventRecorder:
    """Hashes the pages of new nodes and queues the cache's KV events, coalesced."""

    __slots__ = (
        "_dynamo",
        "_grown",
        "_pack",
        "_queue",
        "_salt_seeds",
        "_seeds",
        "_step",
        "_unpack",
        "_vllm",
        "hash_format",
        "page_size",
    )

    def __init__(self, page_size: int, hash_format: str = "sglang") -> None:
        check_hash_format(hash_format)
        self.page_size = page_size
        self.hash_format = hash_format
        self._dynamo = hash_format == "dynamo"
        self._vllm = hash_format == "vllm-sha256"
        self._step = 4 * page_size
        self._salt_seeds: dict[str, bytes] = {}
        self._queue: list = []
        # The queued event whose lists are its own (grown by a merge): extended in place.
        self._grown: BlockStored | BlockRemoved | None = None
        # Reads the published hash (first 8 bytes, big-endian signed) of n joined digests.
        self._unpack: dict[int, Callable[[bytes], tuple]] = {}
        # Packs n token ids as 4-byte little-endian unsigned integers.
        self._pack: dict[int, Callable[..., bytes]] = {}
        self._seeds: dict[tuple[str | None, str | None], bytes | None] = {}

    def pack(self, token_ids: list[int] | array) -> bytes | tuple[int, ...]:
        """The token ids as the hash input: 4-byte little-endian each, or the ids themselves as
        a tuple when one exceeds 2**32 - 1 (hashed in SGLang's wide encoding); ValueError if an
        id is not hashable. A cache packs an insert's new tokens once, before changing state;
        packed tokens (``array('I')``) are copied as they are."""
        if type(token_ids) is array:
            if _PACKED_IS_HASH_INPUT:
                return token_ids.tobytes()
            token_ids = token_ids.tolist()
        if pack_u32 is not None:  # the native packing, for plain ids in [0, 2**32 - 1]
            raw = pack_u32(token_ids)
            if raw is not None:
                return raw
        pack = self._pack.get(len(token_ids))
        if pack is None:
            if len(self._pack) > 256:
                self._pack.clear()
            pack = self._pack[len(token_ids)] = Struct(f"<{len(token_ids)}I").pack
        try:
            return pack(*token_ids)
        except struct_error:
            wide = tuple(token_ids)
            chain_ids(b"", wide, len(wide))  # raises the clear error for unhashable ids
            return wide

    @staticmethod
    def cut(raw: bytes | tuple[int, ...], n: int) -> tuple[bytes | tuple[int, ...], ...]:
        """``pack`` output split after ``n`` tokens."""
        if type(raw) is bytes:
            return raw[: 4 * n], raw[4 * n :]
        return raw[:n], raw[n:]

    def hash_pages(self, node: Any, raw: bytes | tuple[int, ...]) -> bytes:
        """The 32-byte chain digests of ``node``'s pages, end to end, chained from its parent's
        last digest (a salted node under the root: from its salt's seed); ``raw`` is
        ``pack(node.key)``."""
        prev = node.parent.digests[-32:]
        if self._vllm:
            salt = None if prev or node.namespace is None else node.namespace[1]
            return b"".join(
                vllm_page_digests(node.key, self.page_size, prev or None, cache_salt=salt)
            )
        if not prev and node.namespace is not None and node.namespace[1] is not None:
            salt = node.namespace[1]
            prev = self._salt_seeds.get(salt)
            if prev is None:
                if len(self._salt_seeds) > 4096:
                    self._salt_seeds.clear()
                prev = self._salt_seeds[salt] = salt_seed(salt)
        if type(raw) is bytes:
            return chain_packed(prev, raw, self._step)
        return chain_ids(prev, raw, self.page_size)

    def stored(self, node: Any, raw: bytes) -> None:
        """Hash ``node``'s pages onto it (``digests``, ``hashes``) and queue its BlockStored.

        ``raw`` is ``pack(node.key)``; ``node.parent`` must already carry its digests and hashes.
        """
        joined = self.hash_pages(node, raw)
        n = len(joined) // 32
        unpack = self._unpack.get(n)
        if unpack is None:
            if len(self._unpack) > 256:
                self._unpack.clear()
            # SGLang publishes a digest's first 8 bytes (signed), vLLM its last 8 (unsigned).
            layout = "24xQ" if self._vllm else "q24x"
            unpack = self._unpack[n] = Struct(">" + layout * n).unpack
        hashes = list(unpack(joined))
        namespace = node.namespace
        if namespace is not None and self._dynamo:
            seed = self._seeds.get(namespace)
            if seed is None:
                if len(self._seeds) > 4096:
                    self._seeds.clear()
                seed = self._seeds[namespace] = namespace_seed(*namespace)
            hashes = [namespaced_hash(seed, h) for h in hashes]
        node.digests = joined
        node.hashes = hashes
        self._queue_stored(node, MEDIUM_GPU)

    def announce(self, node: Any, medium: str) -> None:
        """Queue a BlockStored of ``node``'s already hashed pages on ``medium`` (a copy of them
        that appeared on another tier, or came back to the device)."""
        self._queue_stored(node, medium)

    def _queue_stored(self, node: Any, medium: str) -> None:
        hashes, key, namespace = node.hashes, node.key, node.namespace
        salt = None if namespace is None else namespace[1]
        parent_hashes = node.parent.hashes
        queue = self._queue
        if queue and parent_hashes:
            tail = queue[-1]
            # The recorder's events carry no LoRA or session: the rest of the key must match.
            if (
                type(tail) is BlockStored
                and tail.block_hashes[-1] == parent_hashes[-1]
                and tail.cache_salt == salt
                and tail.medium == medium
            ):
                tokens = tail.token_ids
                if type(tokens) is not type(key):  # a list meets packed ids: join as a list
                    tokens, key = as_list(tokens), as_list(key)
                if tail is self._grown:
                    tail.block_hashes += hashes
                    tokens += key
                else:
                    tail.block_hashes = tail.block_hashes + hashes
                    tokens = tokens + key
                    self._grown = tail
                tail.token_ids = tokens
                return
        parent_hash = parent_hashes[-1] if parent_hashes else None
        queue.append(BlockStored(hashes, parent_hash, key, self.page_size, None, medium, salt))

    def removed(self, node: Any, medium: str = MEDIUM_GPU) -> None:
        """Queue the withdrawal of ``node``'s pages from ``medium`` (merged into a BlockRemoved
        of the same medium at the tail)."""
        queue = self._queue
        if queue:
            tail = queue[-1]
            if type(tail) is BlockRemoved and tail.medium == medium:
                if tail is self._grown:
                    tail.block_hashes += node.hashes
                else:
                    tail.block_hashes = tail.block_hashes + node.hashes
                    self._grown = tail
                return
        queue.append(BlockRemoved(node.hashes, medium))

    def cleared(self) -> None:
        """Queue ``AllBlocksCleared``."""
        self._queue.append(AllBlocksCleared())

    def take(self) -> list:
        """The queued events, oldest first; the queue starts over empty."""
        events = self._queue
        self._queue = []
        self._grown = None
        return events
