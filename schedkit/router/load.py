"""The load signals a router has of each worker, beyond requests in flight.

Two sources feed a ``LoadBoard``, and both fleets (``schedkit.fleet.offline`` and
``schedkit.fleet.live``) feed it the same way:

- the request's life as the router sees it: ``routed`` (the router calls it itself),
  ``prefilled`` (its first token came back), ``finished`` (it finished, failed or was aborted);
- the worker's own reports: ``report(rank, kv_usage=..., waiting=...)`` from its
  ``KvMetrics`` (the KV router's metrics socket) or its ``get_loads`` answer.

Per worker this gives requests in flight, requests routed in all, requests queued (routed, no
first token yet), the prefill tokens still to compute (each queued prompt past the prefix
matched at routing), the
decode tokens (prompts of requests past their first token) and the reported KV-pool usage.
Everything here is bounded by the requests in flight.
"""

from __future__ import annotations

import attrs

__all__ = ["LoadBoard", "WorkerLoad"]


@attrs.define(slots=True)
class WorkerLoad:
    """One worker's load as the router knows it."""

    requests: int = 0
    routed: int = 0
    queued: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    kv_usage: float = 0.0
    reported_waiting: int | None = None

    @property
    def tokens(self) -> int:
        """Tokens in flight: prefill still to compute plus decode context."""
        return self.prefill_tokens + self.decode_tokens


@attrs.define(slots=True)
class _InFlight:
    rank: int
    prompt_tokens: int
    prefill_tokens: int
    prefilled: bool = False


class LoadBoard:
    """Each rank's ``WorkerLoad``, kept from the requests routed and the workers' reports."""

    __slots__ = ("_inflight", "workers")

    def __init__(self, ranks: list[int] | range) -> None:
        self.workers: dict[int, WorkerLoad] = {rank: WorkerLoad() for rank in ranks}
        self._inflight: dict[str, _InFlight] = {}

    def __getitem__(self, rank: int) -> WorkerLoad:
        return self.workers[rank]

    def __len__(self) -> int:
        """Requests in flight."""
        return len(self._inflight)

    def oldest(self) -> str | None:
        """The request in flight routed first (None when none is)."""
        return next(iter(self._inflight), None)

    def rank_of(self, rid: str) -> int | None:
        """The rank ``rid`` was routed to, while it is in flight."""
        entry = self._inflight.get(rid)
        return None if entry is None else entry.rank

    def is_queued(self, rid: str) -> bool:
        """True while ``rid`` is routed and its first token has not come back."""
        entry = self._inflight.get(rid)
        return entry is not None and not entry.prefilled

    def routed(self, rid: str, rank: int, prompt_tokens: int, cached_tokens: int = 0) -> None:
        """``rid`` (a prompt of ``prompt_tokens``, ``cached_tokens`` of it matched on ``rank``)
        was sent to ``rank``. A rid still in flight is finished first."""
        if rid in self._inflight:
            self.finished(rid)
        prefill = max(0, prompt_tokens - cached_tokens)
        self._inflight[rid] = _InFlight(rank, prompt_tokens, prefill)
        load = self.workers[rank]
        load.requests += 1
        load.routed += 1
        load.queued += 1
        load.prefill_tokens += prefill

    def prefilled(self, rid: str) -> None:
        """``rid``'s first token came back: its prompt moves from prefill to decode."""
        entry = self._inflight.get(rid)
        if entry is None or entry.prefilled:
            return
        entry.prefilled = True
        load = self.workers[entry.rank]
        load.queued -= 1
        load.prefill_tokens -= entry.prefill_tokens
        load.decode_tokens += entry.prompt_tokens

    def finished(self, rid: str) -> None:
        """``rid`` left its worker (finished, failed or aborted); unknown rids are ignored."""
        entry = self._inflight.pop(rid, None)
        if entry is None:
            return
        load = self.workers[entry.rank]
        load.requests -= 1
        if entry.prefilled:
            load.decode_tokens -= entry.prompt_tokens
        else:
            load.queued -= 1
            load.prefill_tokens -= entry.prefill_tokens

    def report(
        self, rank: int, *, kv_usage: float | None = None, waiting: int | None = None
    ) -> None:
        """A worker's own figures: KV-pool usage (a fraction) and waiting requests."""
        load = self.workers.get(rank)
        if load is None:
            return
        if kv_usage is not None:
            load.kv_usage = float(kv_usage)
        if waiting is not None:
            load.reported_waiting = int(waiting)

    def remove(self, rank: int) -> None:
        """Forget ``rank`` and the requests routed to it."""
        self.workers.pop(rank, None)
        for rid in [rid for rid, e in self._inflight.items() if e.rank == rank]:
            del self._inflight[rid]
