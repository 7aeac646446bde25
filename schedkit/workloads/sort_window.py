"""Putting a trace's arrivals in time order in bounded memory: a window of the next arrivals,
the earliest let out once the window is full. A file whose arrivals are out of order by more
than the window holds is refused at its first such line rather than read whole."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

__all__ = ["SORT_WINDOW_ITEMS", "SORT_WINDOW_TOKENS", "SortWindow"]

SORT_WINDOW_ITEMS = 4096  # arrivals held at most
SORT_WINDOW_TOKENS = 1 << 21  # and prompt tokens held at most (~75 MiB as token lists)


class SortWindow:
    """Arrivals pushed in file order come out in time order (ties in file order), as long as
    none is earlier than one already let out; ``late(time)`` says which one that would be."""

    __slots__ = ("_heap", "_tokens", "last_out")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []
        self._tokens = 0
        self.last_out: tuple[float, int] | None = None  # (time, line) of the latest let out

    def late(self, time: float) -> tuple[float, int] | None:
        """The (time, line) already let out that an arrival at ``time`` would come after."""
        last = self.last_out
        return last if last is not None and time < last[0] else None

    def push(self, time: float, line: int, item: Any, tokens: int) -> Iterator[Any]:
        """Add an arrival (``tokens`` it holds); yields the items let out to make room."""
        heapq.heappush(self._heap, (time, line, tokens, item))
        self._tokens += tokens
        while len(self._heap) > SORT_WINDOW_ITEMS or (
            self._tokens > SORT_WINDOW_TOKENS and len(self._heap) > 1
        ):
            yield self._pop()

    def drain(self) -> Iterator[Any]:
        """The items still held, in time order."""
        while self._heap:
            yield self._pop()

    def _pop(self) -> Any:
        time, line, tokens, item = heapq.heappop(self._heap)
        self._tokens -= tokens
        self.last_out = (time, line)
        return item
