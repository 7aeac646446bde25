"""What a KV-event publisher may make a router's index hold: ranks, pages per rank, media.

A publisher names its rank in every batch (SGLang's ``attn_dp_rank``, vLLM's
``data_parallel_rank``) and its pages' medium in every event; neither is the consumer's to
choose. ``RankLimits`` keeps the bounds and counts what went past them.
"""

from __future__ import annotations

import structlog

from schedkit.kv_events.bad_input import BadInput

__all__ = [
    "DEFAULT_MAX_PAGES",
    "DEFAULT_MAX_RANKS",
    "DEFAULT_UNANNOUNCED_PAGES",
    "DEFAULT_VIOLATION_THRESHOLD",
    "RankLimits",
]

log = structlog.get_logger(__name__)

# The most pages a rank may announce: ~64 bytes each in the index (the hash and its slot in the
# rank's set), so ~64 MiB at the bound.
DEFAULT_MAX_PAGES = 1 << 20
# Pages a rank may hold in the index before it announces its pool (~4 MiB): 1M tokens at
# 16-token pages, twice Llama-3-8B's pool on one H100. A rank with a bigger pool or smaller
# pages is indexed in part until it announces its pool.
DEFAULT_UNANNOUNCED_PAGES = 1 << 16
# Ranks the index takes from what batches name (``apply`` without a rank). One publisher
# endpoint carries one rank (SGLang and vLLM bind port + rank per DP rank), so an index fed
# by a few endpoints names a few; 64 unannounced ranks hold at most 256 MiB of pages.
DEFAULT_MAX_RANKS = 64
# Protocol violations (a page stored past the rank's pool, a medium name past the bounds
# below) after which ``violating(rank)`` is True.
DEFAULT_VIOLATION_THRESHOLD = 1024
_MAX_MEDIUM_CHARS = 32
_MAX_MEDIA = 16  # distinct medium names kept (GPU, CPU, disk tiers...); others count as None


class RankLimits:
    """The bounds of an index: ranks taken from the wire, each rank's pool, medium names; and
    the counts of what went past them (``bad_input``, ``violations``, ``unindexed``)."""

    __slots__ = (
        "_capacity",
        "_media",
        "_unindexed",
        "_violations",
        "bad_input",
        "max_pages",
        "max_ranks",
        "unannounced_pages",
        "violation_threshold",
    )

    def __init__(
        self,
        *,
        max_pages: int = DEFAULT_MAX_PAGES,
        unannounced_pages: int = DEFAULT_UNANNOUNCED_PAGES,
        violation_threshold: int = DEFAULT_VIOLATION_THRESHOLD,
        max_ranks: int = DEFAULT_MAX_RANKS,
    ) -> None:
        if min(max_pages, unannounced_pages, violation_threshold, max_ranks) < 1:
            raise ValueError(
                "max_pages, unannounced_pages, violation_threshold and max_ranks must be >= 1"
            )
        self.max_pages = max_pages
        self.unannounced_pages = min(unannounced_pages, max_pages)
        self.violation_threshold = violation_threshold
        self.max_ranks = max_ranks
        self.bad_input = BadInput("kv index", "kv_events.index_refused", log)
        self._capacity: dict[int, int] = {}
        self._violations: dict[int, int] = {}
        self._unindexed: dict[int, int] = {}
        self._media: dict[str, str] = {}

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

    def _refuse_rank(self, rank: int, known: int) -> None:
        """A batch named a new rank while ``known`` ranks are known: not applied, counted."""
        self.bad_input(
            "rank",
            rank=rank,
            known_ranks=known,
            max_ranks=self.max_ranks,
            fix="apply each endpoint's batches with the rank it serves (apply(batch, rank)) "
            "or raise max_ranks",
        )

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
