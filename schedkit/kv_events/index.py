"""A router-side index of which data-parallel rank holds which KV pages, built from events."""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Sequence
from collections.abc import Set as AbstractSet
from itertools import islice, repeat, takewhile

import structlog

from schedkit.kv_events.attention_groups import AttentionGroups
from schedkit.kv_events.hashing import page_hashes
from schedkit.kv_events.structs import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

__all__ = [
    "DEFAULT_MAX_PAGES",
    "DEFAULT_UNANNOUNCED_PAGES",
    "DEFAULT_VIOLATION_THRESHOLD",
    "KvIndex",
]

log = structlog.get_logger(__name__)

# The most pages a rank may announce: ~64 bytes each in the index (the hash and its slot in the
# rank's set), so ~64 MiB at the bound.
DEFAULT_MAX_PAGES = 1 << 20
# Pages a rank may hold in the index before it announces its pool (~4 MiB): 1M tokens at
# 16-token pages, twice Llama-3-8B's pool on one H100. A rank with a bigger pool or smaller
# pages is indexed in part until it announces its pool.
DEFAULT_UNANNOUNCED_PAGES = 1 << 16
# Protocol violations (a page stored past the rank's pool, a medium name past the bounds
# below) after which ``violating(rank)`` is True.
DEFAULT_VIOLATION_THRESHOLD = 1024
_MAX_MEDIUM_CHARS = 32
_MAX_MEDIA = 16  # distinct medium names kept (GPU, CPU, disk tiers...); others count as None
_NOTHING_HELD: frozenset[int] = frozenset()
_consume = deque(maxlen=0).extend  # runs an iterator to its end in C, keeping nothing


def first_missing(held: Container[int], hashes: Sequence[int], start: int = 0) -> int:
    """The position of the first of ``hashes`` from ``start`` on that is not in ``held``
    (``len(hashes)`` when all are): one pass in C, stopping at the first miss."""
    tail = hashes if not start else islice(hashes, start, None)
    return start + len(list(takewhile(held.__contains__, tail)))


class KvIndex:
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
    """

    __slots__ = (
        "_capacity",
        "_groups",
        "_held",
        "_media",
        "_other_medium",
        "_unindexed",
        "_usual_medium",
        "_violations",
        "max_pages",
        "medium",
        "unannounced_pages",
        "violation_threshold",
    )

    def __init__(
        self,
        *,
        max_pages: int = DEFAULT_MAX_PAGES,
        unannounced_pages: int = DEFAULT_UNANNOUNCED_PAGES,
        violation_threshold: int = DEFAULT_VIOLATION_THRESHOLD,
        medium: str | None = None,
    ) -> None:
        if min(max_pages, unannounced_pages, violation_threshold) < 1:
            raise ValueError("max_pages, unannounced_pages and violation_threshold must be >= 1")
        self.max_pages = max_pages
        self.unannounced_pages = min(unannounced_pages, max_pages)
        self.violation_threshold = violation_threshold
        self.medium = medium
        self._held: dict[int, set[int]] = {}
        self._usual_medium: dict[int, str | None] = {}  # rank -> medium of its first page
        self._other_medium: dict[int, dict[int, str | None]] = {}  # rank -> {hash: medium}
        self._capacity: dict[int, int] = {}
        self._violations: dict[int, int] = {}
        self._unindexed: dict[int, int] = {}
        self._media: dict[str, str] = {}
        self._groups = AttentionGroups()

    def set_capacity(self, rank: int, pages: int) -> None:
        """The pool ``rank`` announced, in pages (clamped to 1..``max_pages``)."""
        self._capacity[rank] = max(1, min(int(pages), self.max_pages))

    def capacity(self, rank: int) -> int:
        """The most pages ``rank`` may hold in the index."""
        return self._capacity.get(rank, self.unannounced_pages)

    def announced(self, rank: int) -> bool:
        """Whether ``rank``'s pool is known (``set_capacity``)."""
        return rank in self._capacity

    def unindexed(self, rank: int) -> int:
        """Pages ``rank`` stored past ``unannounced_pages`` before it announced its pool."""
        return self._unindexed.get(rank, 0)

    def violations(self, rank: int) -> int:
        """Protocol violations counted against ``rank``."""
        return self._violations.get(rank, 0)

    def violating(self, rank: int) -> bool:
        """True once ``rank`` has ``violation_threshold`` violations or more."""
        return self._violations.get(rank, 0) >= self.violation_threshold

    def apply(self, batch: EventBatch, rank: int | None = None) -> None:
        """Apply a batch's events to ``rank`` (default: the batch's ``attn_dp_rank``, else 0)."""
        if rank is None:
            rank = batch.attn_dp_rank if batch.attn_dp_rank is not None else 0
        held = self._held.get(rank)
        if held is None:
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

    def _unannounced_excess(self, rank: int, count: int) -> None:
        before = self._unindexed.get(rank, 0)
        self._unindexed[rank] = before + count
        if not before:
            log.warning(
                "kv_events.index_pool_unknown",
                rank=rank,
                indexed=self.unannounced_pages,
                fix="give the router the rank's pool (capacity=) or let it send KvMetrics",
            )

    def _medium(self, medium: str, rank: int) -> str | None:
        known = self._media.get(medium)
        if known is not None:
            return known
        if len(medium) > _MAX_MEDIUM_CHARS or len(self._media) >= _MAX_MEDIA:
            self._violate(rank, 1, f"a medium name past the bounds: {medium[:40]!r}")
            return None
        self._media[medium] = medium
        return medium

    def _violate(self, rank: int, count: int, what: str) -> None:
        before = self._violations.get(rank, 0)
        self._violations[rank] = before + count
        if before < self.violation_threshold <= before + count:
            log.warning(
                "kv_events.index_violations",
                rank=rank,
                violations=before + count,
                threshold=self.violation_threshold,
                last=what,
            )

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
