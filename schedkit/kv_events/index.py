"""A router-side index of which data-parallel rank holds which KV pages, built from events."""

from __future__ import annotations

from collections.abc import Sequence

from schedkit.kv_events.hashing import page_hashes
from schedkit.kv_events.structs import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

__all__ = ["KvIndex"]


class KvIndex:
    """Block hash -> {rank: medium}, plus each rank's set of hashes.

    Fed with event batches (``apply``), it answers how many leading pages of a token sequence
    each rank holds (``match``), hashing pages exactly as the caches do.
    """

    __slots__ = ("_blocks", "_owners")

    def __init__(self) -> None:
        self._owners: dict[int, dict[int, str | None]] = {}
        self._blocks: dict[int, set[int]] = {}

    def apply(self, batch: EventBatch, rank: int | None = None) -> None:
        """Apply a batch's events to ``rank`` (default: the batch's ``attn_dp_rank``, else 0)."""
        if rank is None:
            rank = batch.attn_dp_rank if batch.attn_dp_rank is not None else 0
        owners = self._owners
        blocks = self._blocks.setdefault(rank, set())
        for event in batch.events:
            kind = type(event)
            if kind is BlockStored:
                medium = event.medium
                for h in event.block_hashes:
                    blocks.add(h)
                    ranks = owners.get(h)
                    if ranks is None:
                        owners[h] = {rank: medium}
                    else:
                        ranks[rank] = medium
            elif kind is BlockRemoved:
                for h in event.block_hashes:
                    blocks.discard(h)
                    ranks = owners.get(h)
                    if ranks is not None:
                        ranks.pop(rank, None)
                        if not ranks:
                            del owners[h]
            elif kind is AllBlocksCleared:
                self.clear_rank(rank)
            else:
                raise TypeError(f"unknown KV event {event!r}")

    def clear_rank(self, rank: int) -> None:
        """Forget every block of ``rank`` (after AllBlocksCleared, a restart or lost history)."""
        blocks = self._blocks.get(rank)
        if not blocks:
            return
        owners = self._owners
        for h in blocks:
            ranks = owners.get(h)
            if ranks is not None:
                ranks.pop(rank, None)
                if not ranks:
                    del owners[h]
        blocks.clear()

    def blocks(self, rank: int) -> set[int]:
        """A copy of the hashes ``rank`` holds."""
        return set(self._blocks.get(rank, ()))

    def num_blocks(self, rank: int) -> int:
        """How many hashes ``rank`` holds (no copy)."""
        blocks = self._blocks.get(rank)
        return 0 if blocks is None else len(blocks)

    def ranks(self) -> list[int]:
        """The ranks seen so far, in order."""
        return sorted(self._blocks)

    def owners(self, block_hash: int) -> dict[int, str | None]:
        """Rank -> medium for every rank holding ``block_hash``."""
        return dict(self._owners.get(block_hash, {}))

    def __len__(self) -> int:
        return len(self._owners)

    def match(
        self,
        token_ids: Sequence[int],
        page_size: int,
        *,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        hash_format: str = "sglang",
    ) -> dict[int, int]:
        """For every known rank, how many leading pages of ``token_ids`` it holds (in the
        request's namespace, when it has one, hashed as the caches' ``hash_format``)."""
        counts = dict.fromkeys(self._blocks, 0)
        live = set(counts)
        owners = self._owners
        for i, h in enumerate(
            page_hashes(
                token_ids,
                page_size,
                extra_key=extra_key,
                cache_salt=cache_salt,
                hash_format=hash_format,
            ),
            1,
        ):
            ranks = owners.get(h)
            if ranks is None:
                break
            live.intersection_update(ranks)
            if not live:
                break
            for rank in live:
                counts[rank] = i
        return counts
