"""Prompts routed to a worker but not yet prefilled there, as pages, overlaid on the KV-event
index.

A worker publishes a prompt's pages only once it has computed them, so an index fed only by
KV events does not see what was just routed: requests sharing a prefix that arrive together
scatter, and a "fewest cached pages" rule keeps choosing the worker that just evicted (its
pages leave the index at once, the pages it is about to compute are not there yet).
``PendingPrompts`` holds each routed prompt's page hashes until its first token comes back or
it ends (by then the worker has published them), and ``match`` counts a page as held by a
worker when the index or the overlay says so. ``num_pages`` (for a policy that compares how
many pages each worker holds) needs each prompt's pages checked against the index as it is
routed; a router whose policy never reads it makes its overlay with ``count_new=False``.
A prompt's first ``max_pages`` pages (256: 4,096 tokens at page 16) are held, so the overlay
holds at most that many per request in flight.
"""

from __future__ import annotations

from collections.abc import Iterable

from schedkit.kv_events import KvIndex
from schedkit.kv_events.index import first_missing
from schedkit.router.base import release_pages

__all__ = ["PendingPrompts"]


class PendingPrompts:
    """Rank -> {page hash: prompts in flight holding it}, by request id."""

    __slots__ = ("_by_rid", "_extra", "_pages", "count_new", "max_pages")

    def __init__(self, max_pages: int = 256, *, count_new: bool = True) -> None:
        self.max_pages = max_pages
        self.count_new = count_new
        self._pages: dict[int, dict[int, int]] = {}
        self._extra: dict[int, int] = {}  # pages on a rank that the index did not hold
        self._by_rid: dict[str, tuple[int, list[int], int]] = {}

    def __len__(self) -> int:
        return len(self._by_rid)

    def add(self, rid: str, rank: int, hashes: list[int], index: KvIndex) -> None:
        """``rid``'s pages (``hashes``) are on their way to ``rank``."""
        self.discard(rid)
        hashes = hashes[: self.max_pages]
        pages = self._pages.setdefault(rank, {})
        get = pages.get
        new = 0
        if self.count_new:
            held = index.held(rank)
            for h in hashes:
                count = get(h, 0)
                if count == 0 and h not in held:
                    new += 1
                pages[h] = count + 1
        else:
            for h in hashes:
                pages[h] = get(h, 0) + 1
        self._extra[rank] = self._extra.get(rank, 0) + new
        self._by_rid[rid] = (rank, hashes, new)

    def discard(self, rid: str) -> None:
        """``rid`` was prefilled or ended: its pages leave the overlay (unknown rids: no-op)."""
        entry = self._by_rid.pop(rid, None)
        if entry is None:
            return
        rank, hashes, new = entry
        pages = self._pages.get(rank)
        if pages is None:
            return
        release_pages(pages, hashes)
        self._extra[rank] = self._extra.get(rank, 0) - new

    def clear_rank(self, rank: int) -> None:
        """Forget everything routed to ``rank``."""
        self._pages.pop(rank, None)
        self._extra.pop(rank, None)
        for rid in [rid for rid, entry in self._by_rid.items() if entry[0] == rank]:
            del self._by_rid[rid]

    def num_pages(self, rank: int) -> int:
        """Pages routed to ``rank`` that its index entry did not hold when they were routed;
        RuntimeError when they are not counted (``count_new=False``)."""
        if not self.count_new:
            raise RuntimeError("pending pages are not counted here (count_new=False)")
        return self._extra.get(rank, 0)

    def match(self, hashes: list[int], ranks: Iterable[int], index: KvIndex) -> dict[int, int]:
        """For each of ``ranks``, how many leading pages of ``hashes`` it holds in the index
        or has on its way."""
        counts = {}
        end = len(hashes)
        for rank in ranks:
            held = index.held(rank)
            matched = first_missing(held, hashes)
            pending = self._pages.get(rank)
            if pending:  # runs of pages on their way and runs held, in turn
                while matched < end and hashes[matched] in pending:
                    matched = first_missing(held, hashes, first_missing(pending, hashes, matched))
            counts[rank] = matched
        return counts
