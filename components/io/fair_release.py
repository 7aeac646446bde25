"""Fair release of accepted requests to the scheduler: round-robin by client, one set at a time.

The request edge holds what each client sent and hands the scheduler a set of requests taken in
turn from each client that has some (one request per client per turn, until the set holds
``max_set_tokens`` prompt tokens; a set always holds at least one request). The next set goes
out only once every request of the current one was admitted into a batch (its
``scheduled_time`` is set) or finished. The scheduler's waiting queue thus holds at most one
set, whatever its policy orders, and a request that arrives behind another client's flood waits
for one set to be admitted, then goes out in the next, ahead of the flood's next request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

import attrs

from schedkit.core.schedule_batch import Req

__all__ = ["FairRelease"]


@attrs.define(slots=True, eq=False)
class FairRelease:
    """Requests held by client and released in fair sets; see the module docstring."""

    max_set_tokens: int
    # Clients with held requests, the next to be served first.
    _held: dict[Hashable, deque[Req]] = attrs.Factory(dict)
    _released: list[Req] = attrs.Factory(list)
    held_count: int = 0

    def hold(self, client: Hashable, req: Req) -> None:
        """Keep ``req`` of ``client`` until its turn."""
        queue = self._held.get(client)
        if queue is None:  # a client that had nothing held is served first
            queue = deque()
            self._held = {client: queue, **self._held}
        queue.append(req)
        self.held_count += 1

    def releasable(self) -> bool:
        """Whether ``release`` would hand out requests now."""
        return bool(self._held) and self._set_admitted()

    def release(self) -> list[Req]:
        """The next set, once the previous one was admitted; else nothing."""
        if not self._held or not self._set_admitted():
            return []
        released, tokens = [], 0
        held = self._held
        while held and tokens < self.max_set_tokens:
            for client in list(held):
                queue = held.pop(client)
                req = queue.popleft()
                released.append(req)
                tokens += len(req.origin_input_ids)
                if queue:
                    held[client] = queue  # to the back of the turn order
                if tokens >= self.max_set_tokens:
                    break
        self.held_count -= len(released)
        self._released = released
        return released

    def _set_admitted(self) -> bool:
        released = self._released
        while released:
            req = released[-1]
            if req.scheduled_time is None and req.finished_reason is None:
                return False
            released.pop()
        return True

    def take(self, client: Hashable, rid: str) -> Req | None:
        """Remove and return ``client``'s held request ``rid``, if held."""
        queue = self._held.get(client)
        if queue is None:
            return None
        for req in queue:
            if req.rid == rid:
                queue.remove(req)
                self.held_count -= 1
                if not queue:
                    del self._held[client]
                return req
        return None

    def drop(self, client: Hashable) -> list[Req]:
        """Remove and return every request ``client`` has held."""
        queue = self._held.pop(client, None)
        if not queue:
            return []
        self.held_count -= len(queue)
        return list(queue)

    def newest_held(self, client: Hashable) -> Req | None:
        """``client``'s most recently held request, if any."""
        queue = self._held.get(client)
        return queue[-1] if queue else None

    def held_of(self, client: Hashable) -> int:
        """How many requests ``client`` has held."""
        queue = self._held.get(client)
        return len(queue) if queue else 0
