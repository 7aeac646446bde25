"""Control replies a fleet owes its clients, sent in the order the requests came: a client
matches each reply to its oldest control request, so a reply that waits on the workers (a
pause, continue or flush sent to each of them) holds back the ones after it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

import attrs

__all__ = ["OwedReplies", "OwedReply"]


@attrs.define
class OwedReply:
    """One reply owed to ``identity`` for a ``kind`` request: ready once ``waiting`` (the
    workers still to answer) is empty; ``ok`` until one fails, with ``messages`` saying how."""

    identity: bytes
    kind: str
    waiting: set[int] = attrs.Factory(set)
    ok: bool = True
    messages: list[str] = attrs.Factory(list)

    def failed(self, message: str) -> None:
        """Note that part of it failed."""
        self.ok = False
        self.messages.append(message)


class OwedReplies:
    """The replies owed, oldest first."""

    def __init__(self) -> None:
        self._owed: deque[OwedReply] = deque()

    def owe(self, identity: bytes, kind: str, waiting: Iterable[int] = ()) -> OwedReply:
        """Owe ``identity`` a reply to a ``kind`` request, once ``waiting`` have answered."""
        reply = OwedReply(identity, kind, set(waiting))
        self._owed.append(reply)
        return reply

    def answered(self, rank: int, kind: str, ok: bool, message: str | None) -> None:
        """Worker ``rank`` answered the oldest ``kind`` request still waiting for it."""
        for reply in self._owed:
            if reply.kind == kind and rank in reply.waiting:
                reply.waiting.discard(rank)
                if not ok:
                    reply.failed(f"worker {rank}: {message or 'refused'}")
                return

    def lost(self, rank: int, why: str) -> None:
        """Worker ``rank`` is gone: nothing waits for it, and what did, failed."""
        for reply in self._owed:
            if rank in reply.waiting:
                reply.waiting.discard(rank)
                reply.failed(f"worker {rank} was taken out: {why}")

    def ready(self) -> Iterator[OwedReply]:
        """Take the replies that may be sent now, in order."""
        owed = self._owed
        while owed and not owed[0].waiting:
            yield owed.popleft()

    def __len__(self) -> int:
        return len(self._owed)
