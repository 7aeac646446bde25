"""How a fleet replays a workload: open loop (each request at its own arrival time) or
closed loop (``ClosedLoop``: a fixed number of clients, each sending its next request when its
previous one ended, as Dynamo's aiperf and llm-d's benchmarks drive a server)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import attrs

from schedkit.core.schedule_batch import Req
from schedkit.workloads.workload import Arrival, Workload

__all__ = ["ClosedLoop", "replay_mode"]


@attrs.define
class ClosedLoop:
    """``inner``'s requests sent by ``concurrency`` clients in the workload's order: each
    client sends a request, and the moment it ends (finished, refused, timed out or failed)
    sends the next one. Arrival times in the workload are ignored; a request's latency counts
    from when its client sent it. A follow-up the inner workload makes of a finished request
    (a chat's next turn) is sent by the next free client before any new request."""

    inner: Workload
    concurrency: int = attrs.field(validator=attrs.validators.ge(1))
    _source: Iterator[Arrival] | None = attrs.field(default=None, init=False)
    _follow_ups: deque[Req] = attrs.field(factory=deque, init=False)

    def _next(self, now: float) -> Arrival | None:
        if self._follow_ups:
            return Arrival(now, self._follow_ups.popleft())
        if self._source is None:
            self._source = iter(self.inner.initial())
        arrival = next(self._source, None)
        return None if arrival is None else Arrival(now, arrival.req)

    def initial(self) -> Iterator[Arrival]:
        """The first request of each client, all at time 0."""
        self._source = iter(self.inner.initial())
        self._follow_ups.clear()
        for _ in range(self.concurrency):
            arrival = self._next(0.0)
            if arrival is None:
                return
            yield arrival

    def follow_up(self, req: Req, now: float) -> Arrival | None:
        """The next request of the client whose request ``req`` ended at ``now``."""
        follow = self.inner.follow_up(req, now)
        if follow is not None:
            self._follow_ups.append(follow.req)
        return self._next(now)


def replay_mode(concurrency: int | None, speedup: float | None) -> str:
    """How a run replayed its workload, for the summary."""
    if concurrency is not None:
        return f"closed loop, {concurrency} clients"
    return "open loop" + (f", speedup {speedup:g}" if speedup not in (None, 1.0) else "")
