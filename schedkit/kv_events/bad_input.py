"""Counting what a peer sends that cannot be used: by kind, the first of each kind logged with
where it came from, so a stream of garbage costs a counter and one log line per kind."""

from __future__ import annotations

from typing import Protocol

__all__ = ["BadInput"]

_DETAIL_LIMIT = 200  # characters of a decoder's message kept in the log line


class _Logger(Protocol):
    def warning(self, event: str, **fields: object) -> object: ...


class BadInput:
    """Bad items from ``source`` (an endpoint, a file), counted by kind in ``counts``; the
    first of each kind is logged as ``event`` with the source, the kind and the details."""

    __slots__ = ("_event", "_log", "counts", "source")

    def __init__(self, source: str, event: str, log: _Logger) -> None:
        self.source = source
        self.counts: dict[str, int] = {}
        self._event = event
        self._log = log

    def __call__(self, kind: str, **details: object) -> None:
        """Count one bad item of ``kind``; log it if it is the first of its kind."""
        seen = self.counts.get(kind, 0)
        self.counts[kind] = seen + 1
        if not seen:
            shown = {
                key: value[:_DETAIL_LIMIT] if isinstance(value, str) else value
                for key, value in details.items()
            }
            self._log.warning(
                self._event, source=self.source, kind=kind, first_of_kind=True, **shown
            )

    def __getitem__(self, kind: str) -> int:
        return self.counts.get(kind, 0)

    @property
    def total(self) -> int:
        """Bad items of every kind."""
        return sum(self.counts.values())
