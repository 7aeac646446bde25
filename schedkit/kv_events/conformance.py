"""Checking a KV-event stream the way a router relies on it: every batch decodes under the
engine's declarations, seqs run without holes, parents are announced before children, a
removed page was stored, and each BlockStored holds ``block_size`` tokens per hash."""

from __future__ import annotations

from schedkit.kv_events.structs import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from schedkit.kv_events.subscriber import GapDetected, GapFilled, HistoryLost, Notice

__all__ = ["StreamChecker"]

_MAX_PROBLEMS = 50  # kept in detail; the rest are only counted


class StreamChecker:
    """Follows one rank's stream (feed it ``apply`` and ``notice``) and keeps what breaks the
    rules in ``problems``; ``conformant`` when batches came and nothing broke."""

    def __init__(self) -> None:
        self.held: set[int] = set()
        self.batches = 0
        self.events = 0
        self.problems: list[str] = []
        self.problem_count = 0
        self.notices: list[Notice] = []
        self._last_seq: int | None = None

    @property
    def conformant(self) -> bool:
        """True when batches arrived and none broke a rule."""
        return self.batches > 0 and self.problem_count == 0

    def problem(self, text: str) -> None:
        """Record one broken rule."""
        self.problem_count += 1
        if len(self.problems) < _MAX_PROBLEMS:
            self.problems.append(text)

    def notice(self, notice: Notice) -> None:
        """What the subscriber noticed: a gap it filled is fine, lost history is not, a
        restart starts the page set over."""
        self.notices.append(notice)
        if isinstance(notice, HistoryLost):
            self.problem(
                f"seq {notice.expected} onwards lost (replay offered {notice.replay_start})"
            )
        elif not isinstance(notice, GapDetected | GapFilled):
            self.held.clear()
            self._last_seq = None

    def apply(self, seq: int, batch: KVEventBatch) -> None:
        """Check one batch, delivered in seq order."""
        if self._last_seq is not None and seq != self._last_seq + 1:
            self.problem(f"seq {seq} follows {self._last_seq}")
        self._last_seq = seq
        self.batches += 1
        for event in batch.events:
            self.events += 1
            if type(event) is BlockStored:
                self._stored(seq, event)
            elif type(event) is BlockRemoved:
                for h in event.block_hashes:
                    if h not in self.held:
                        self.problem(f"seq {seq}: removed {h}, which is not stored")
                    self.held.discard(h)
            elif type(event) is AllBlocksCleared:
                self.held.clear()

    def _stored(self, seq: int, event: BlockStored) -> None:
        if event.block_size < 1 or len(event.token_ids) != event.block_size * len(
            event.block_hashes
        ):
            self.problem(
                f"seq {seq}: {len(event.token_ids)} token ids for {len(event.block_hashes)} "
                f"hashes of block_size {event.block_size}"
            )
        parent = event.parent_block_hash
        if parent is not None and parent not in self.held:
            self.problem(f"seq {seq}: parent {parent} of {event.block_hashes[0]} not stored")
        for h in event.block_hashes:
            if h in self.held:
                self.problem(f"seq {seq}: {h} stored again without being removed")
            self.held.add(h)

    def report(self) -> list[str]:
        """The verdict and what broke, as lines to print."""
        verdict = "conformant" if self.conformant else "NOT conformant"
        lines = [
            f"{verdict}: {self.batches} batches, {self.events} events, "
            f"{self.problem_count} problems, {len(self.held)} pages held"
        ]
        if self.batches == 0:
            lines.append("  no batch arrived")
        lines += [f"  {p}" for p in self.problems]
        if self.problem_count > len(self.problems):
            lines.append(f"  ... and {self.problem_count - len(self.problems)} more")
        return lines
