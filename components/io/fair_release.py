"""Fair release of accepted requests to the scheduler, round-robin by client.

The request edge holds what each client sent and hands the scheduler, in each call, requests
taken in turn from every client that has none waiting in the scheduler unadmitted: per client at
most ``max_client_tokens`` prompt tokens released and not yet admitted into a batch (at least
one request). Clients that had nothing held are served first. So the scheduler's waiting queue
holds about one turn of each client, not one client's flood.

The scheduler admits waiting requests in its policy's order and stops at the first that does
not fit (SGLang's rule, so that large requests are not starved). A flood's request that waits
for KV room would then hold up every request behind it: when requests go out while another
client's released request still waits unadmitted, that request is moved behind them
(``requeue``), once per request, so a newcomer gets one turn ahead of it and it keeps its
place after that.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

import attrs

from schedkit.core.schedule_batch import Req

__all__ = ["FairRelease"]


@attrs.define(slots=True, eq=False)
class _Released:
    """A request handed to the scheduler and not yet admitted, and whose it is."""

    client: Hashable
    req: Req
    requeued: bool = False


@attrs.define(slots=True, eq=False)
class FairRelease:
    """Requests held by client and released in turns; see the module docstring."""

    max_client_tokens: int
    # Clients with held requests, the next to be served first.
    _held: dict[Hashable, deque[Req]] = attrs.Factory(dict)
    _released: list[_Released] = attrs.Factory(list)
    _unadmitted_tokens: dict[Hashable, int] = attrs.Factory(dict)
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
        self._prune()
        return any(self._may_release(client) for client in self._held)

    def release(self) -> tuple[list[Req], list[str]]:
        """The requests whose turn it is, and the rids of other clients' released requests,
        still unadmitted, to move behind them (each request at most once)."""
        self._prune()
        out: list[Req] = []
        released_by: set[Hashable] = set()
        progress = True
        while progress:
            progress = False
            for client in list(self._held):
                if not self._may_release(client):
                    continue
                queue = self._held.pop(client)
                req = queue.popleft()
                self.held_count -= 1
                out.append(req)
                released_by.add(client)
                self._released.append(_Released(client, req))
                tokens = len(req.origin_input_ids)
                self._unadmitted_tokens[client] = self._unadmitted_tokens.get(client, 0) + tokens
                if queue:
                    self._held[client] = queue  # to the back of the turn order
                progress = True
        requeue = []
        if out:
            for entry in self._released:
                if entry.client not in released_by and not entry.requeued:
                    entry.requeued = True
                    requeue.append(entry.req.rid)
        return out, requeue

    def _may_release(self, client: Hashable) -> bool:
        return self._unadmitted_tokens.get(client, 0) < self.max_client_tokens

    def _prune(self) -> None:
        """Forget released requests that were admitted or finished."""
        if not self._released:
            return
        keep = []
        for entry in self._released:
            req = entry.req
            if req.scheduled_time is None and req.finished_reason is None:
                keep.append(entry)
                continue
            left = self._unadmitted_tokens[entry.client] - len(req.origin_input_ids)
            if left:
                self._unadmitted_tokens[entry.client] = left
            else:
                del self._unadmitted_tokens[entry.client]
        self._released = keep

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

    def drop_all(self) -> list[tuple[Hashable, Req]]:
        """Remove and return every held request with its client."""
        held = [(client, req) for client, queue in self._held.items() for req in queue]
        self._held = {}
        self.held_count = 0
        return held

    def newest_held(self, client: Hashable) -> Req | None:
        """``client``'s most recently held request, if any."""
        queue = self._held.get(client)
        return queue[-1] if queue else None

    def held_of(self, client: Hashable) -> int:
        """How many requests ``client`` has held."""
        queue = self._held.get(client)
        return len(queue) if queue else 0
