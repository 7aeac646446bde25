"""``ReplayRing``: the last batches a KV-event publisher sent, kept for its replay server."""

from __future__ import annotations

__all__ = ["ReplayRing"]


class ReplayRing:
    """The last ``size`` sent batches, addressed by their position in the sent stream (0 for
    the first batch ever added), so a replay walks it without copying it."""

    __slots__ = ("added", "items", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: list = [None] * size
        self.added = 0

    def add(self, item: tuple) -> None:
        """Keep ``item`` (``(seq, seq_bytes, payload)``); the oldest falls out when full."""
        if self.size:
            self.items[self.added % self.size] = item
        self.added += 1

    @property
    def first(self) -> int:
        """The position of the oldest batch still held."""
        return max(0, self.added - self.size)

    def get(self, position: int) -> tuple:
        """The batch at ``position`` (one still held: ``first <= position < added``)."""
        return self.items[position % self.size]

    def find(self, seq: int) -> int:
        """The position of the first held batch with a seq >= ``seq`` (``added`` if none);
        seqs grow along the stream, so this is a binary search."""
        lo, hi = self.first, self.added
        while lo < hi:
            mid = (lo + hi) // 2
            if self.get(mid)[0] < seq:
                lo = mid + 1
            else:
                hi = mid
        return lo
