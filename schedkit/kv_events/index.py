"""A router-side index of which data-parallel rank holds which KV pages, built from events."""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Sequence
from collections.abc import Set as AbstractSet
from itertools import islice, repeat, takewhile

from schedkit.kv_events.attention_groups import AttentionGroups
from schedkit.kv_events.hashing import page_hashes
from schedkit.kv_events.index_limits import (
    DEFAULT_MAX_PAGES,
    DEFAULT_MAX_RANKS,
    DEFAULT_UNANNOUNCED_PAGES,
    DEFAULT_VIOLATION_THRESHOLD,
    RankLimits,
)
from schedkit.kv_events.structs import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

__all__ = [
    "DEFAULT_MAX_PAGES",
    "DEFAULT_MAX_RANKS",
    "DEFAULT_UNANNOUNCED_PAGES",
    "DEFAULT_VIOLATION_THRESHOLD",
    "KvIndex",
]

_NOTHING_HELD: frozenset[int] = frozenset()
_consume = deque(maxlen=0).extend  # runs an iterator to its end in C, keeping nothing


def first_missing(held: Container[int], hashes: Sequence[int], start: int = 0) -> int:
    """The position of the first of ``hashes`` from ``start`` on that is not in ``held``
    (``len(hashes)`` when all are): one pass in C, stopping at the first miss."""
    tail = hashes if not start else islice(hashes, start, None)
    return start + len(list(takewhile(held.__contains__, tail)))


class KvIndex(RankLimits):
    """Each rank's held pages (block hashes, with their medium), built from event batches.

    Fed with event batches (``apply``), it answers how many leading pages of a token sequence
    each rank holds (``match``, hashing pages exactly as the caches do; ``match_hashes`` for
    a prompt already hashed). With ``medium`` (e.g. ``"GPU"``, or ``"CPU_PINNED"`` for
    SGLang's host tier) it follows only the BlockStored and BlockRemoved events of that
    medium, so a router keeps one index per tier. Each event is applied to its rank's set of
    pages as a whole; a match walks each rank's set along the prompt's hashes until the first
    page it does not hold. A page's medium is kept apart only when it is not the rank's
    usual one (that of the first page it stored). Events of remote pages or of a KV-cache group
    that is not main attention (a hybrid model's) are not followed (``attention_groups``).

    A rank holds at most its pool: ``set_capacity(rank, pages)`` (from its config or its
    ``KvMetrics.kv_total_blocks``, at most ``max_pages``). A page stored past it is not kept
    and counts as a protocol violation, as does a medium name longer than 32 characters or
    past 16 distinct ones (kept as None); ``violating(rank)`` tells when a rank has committed
    ``violation_threshold`` of them, for a router to stop trusting it. A rank that has not
    announced its pool holds at most ``unannounced_pages``: a page stored past that is not
    kept either, but counted in ``unindexed(rank)``, not as a violation (it broke no promise),
    and the first one is logged with what to do.

    The ranks are the caller's when it names them (``apply(batch, rank)``: a router follows
    one endpoint per rank it was configured with). A batch applied without a rank goes to the
    rank the batch names, which the publisher chooses: the index takes a rank it does not know
    that way only while it knows fewer than ``max_ranks`` (64); a batch naming one more is not
    applied, counted in ``bad_input["rank"]`` and the first one logged
    (``kv_events.index_refused``) with what to do.
    """

    __slots__ = ("_groups", "_held", "_other_medium", "_usual_medium", "medium")

    def __init__(
        self,
        *,
        max_pages: int = DEFAULT_MAX_PAGES,
        unannounced_pages: int = DEFAULT_UNANNOUNCED_PAGES,
        violation_threshold: int = DEFAULT_VIOLATION_THRESHOLD,
        max_ranks: int = DEFAULT_MAX_RANKS,
        medium: str | None = None,
    ) -> None:
        super().__init__(
            max_pages=max_pages,
            unannounced_pages=unannounced_pages,
            violation_threshold=violation_threshold,
            max_ranks=max_ranks,
        )
        self.medium = medium
        self._held: dict[int, set[int]] = {}
        self._usual_medium: dict[int, str | None] = {}  # rank -> medium of its first page
        self._other_medium: dict[int, dict[int, str | None]] = {}  # rank -> {hash: medium}
        self._groups = AttentionGroups()

    def apply(self, batch: EventBatch, rank: int | None = None) -> None:
        """Apply a batch's events to ``rank`` (default: the batch's ``attn_dp_rank``, else 0;
        a rank named so that would be past ``max_ranks`` is refused: see the class)."""
        named = rank is None
        if named:
            rank = batch.attn_dp_rank if batch.attn_dp_rank is not None else 0
        held = self._held.get(rank)
        if held is None:
            if named and len(self._held) >= self.max_ranks:
                self._refuse_rank(rank, len(self._held))
                return
            held = self._held[rank] = set()
            self._other_medium[rank] = {}
        other = self._other_medium[rank]
        capacity = self._capacity.get(rank, self.unannounced_pages)
        excess = 0
        only = self.medium
        follows = self._groups.follows
        for event in batch.events:
            kind = type(event)
            if kind is BlockStored:
                medium = event.medium
                if only is not None and medium != only:
                    continue
                if (
                    event.group_idx is not None
                    or event.kv_cache_spec_kind is not None
                    or event.locality is not None
                ) and not follows(event, rank):
                    continue
                if medium is not None:
                    medium = self._medium(medium, rank)
                kept = event.block_hashes
                if len(held) + len(kept) <= capacity:  # all fit: no check per page
                    held.update(kept)
                else:
                    kept = []
                    for h in event.block_hashes:
                        if len(held) >= capacity and h not in held:
                            excess += 1
                            continue
                        held.add(h)
                        kept.append(h)
                usual = self._usual_medium.setdefault(rank, medium)
                if medium is not usual and medium != usual:
                    other.update(zip(kept, repeat(medium)))
                elif other:
                    _consume(map(other.pop, kept, repeat(None)))
            elif kind is BlockRemoved:
                if (only is None or event.medium == only) and (
                    (event.group_idx is None and event.locality is None) or follows(event, rank)
                ):
                    held.difference_update(event.block_hashes)
                    if other:
                        _consume(map(other.pop, event.block_hashes, repeat(None)))
            elif kind is AllBlocksCleared:
                held.clear()
                other.clear()
            else:
                raise TypeError(f"unknown KV event {event!r}")
        if excess:
            if rank in self._capacity:
                self._violate(rank, excess, f"stored pages past its pool of {capacity}")
            else:
                self._unannounced_excess(rank, excess)

    def clear_rank(self, rank: int) -> None:
        """Forget every block of ``rank`` (after AllBlocksCleared, a restart or lost history)."""
        held = self._held.get(rank)
        if held:
            held.clear()
            self._other_medium[rank].clear()

    def blocks(self, rank: int) -> set[int]:
        """A copy of the hashes ``rank`` holds."""
        return set(self._held.get(rank, ()))

    def held(self, rank: int) -> AbstractSet[int]:
        """The hashes ``rank`` holds, as the index keeps them (no copy: read it, never change
        it; it follows the index)."""
        return self._held.get(rank, _NOTHING_HELD)

    def num_blocks(self, rank: int) -> int:
        """How many hashes ``rank`` holds (no copy)."""
        held = self._held.get(rank)
        return 0 if held is None else len(held)

    def ranks(self) -> list[int]:
        """The ranks seen so far, in order."""
        return sorted(self._held)

    def owners(self, block_hash: int) -> dict[int, str | None]:
        """Rank -> medium for every rank holding ``block_hash``."""
        return {
            rank: self._other_medium[rank].get(block_hash, self._usual_medium.get(rank))
            for rank, held in self._held.items()
            if block_hash in held
        }

    def holds(self, rank: int, block_hash: int) -> bool:
        """Whether ``rank`` holds ``block_hash`` (no copy)."""
        held = self._held.get(rank)
        return held is not None and block_hash in held

    def holders(self, block_hash: int) -> tuple[int, ...]:
        """The ranks holding ``block_hash``."""
        return tuple(rank for rank, held in self._held.items() if block_hash in held)

    def __len__(self) -> int:
        """How many distinct hashes the ranks hold (walks every rank's pages)."""
        return len(set().union(*self._held.values()))

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
        hashes = page_hashes(
            token_ids,
            page_size,
            extra_key=extra_key,
            cache_salt=cache_salt,
            hash_format=hash_format,
        )
        return self.match_hashes(hashes)

    def match_hashes(
        self, hashes: Sequence[int], ranks: Sequence[int] | None = None
    ) -> dict[int, int]:
        """For each of ``ranks`` (default: every known rank), how many leading pages of a
        prompt whose page hashes are ``hashes`` it holds (0 for a rank never seen)."""
        held = self._held
        if ranks is None:
            return {rank: first_missing(pages, hashes) for rank, pages in held.items()}
        return {rank: first_missing(held.get(rank, _NOTHING_HELD), hashes) for rank in ranks}
