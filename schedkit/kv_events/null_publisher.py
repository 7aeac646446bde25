"""The ``null`` KV-event publisher: it sends nothing and counts what it is given."""

from __future__ import annotations

from schedkit.kv_events.config import KvEventsConfig
from schedkit.kv_events.structs import EventBatch

__all__ = ["NullEventPublisher"]


class NullEventPublisher:
    """A publisher that sends nothing; it only counts the batches it is given."""

    def __init__(self, config: KvEventsConfig | None = None, dp_rank: int = 0) -> None:
        self.config = config
        self.dp_rank = dp_rank
        self.accepted = 0
        self.published = 0
        self.dropped = 0
        self.encode_errors = 0
        self._closed = False

    @property
    def queue_depth(self) -> int:
        """Always 0: nothing is queued."""
        return 0

    def publish(self, batch: EventBatch) -> bool:
        """Count the batch; False (and a drop) after shutdown."""
        if self._closed:
            self.dropped += 1
            return False
        self.accepted += 1
        self.published += 1
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Nothing to wait for."""
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        """Refuse further batches."""
        self._closed = True
