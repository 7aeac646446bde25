"""Fair shares of the running batch between the clients of a request edge (off unless the
scheduler is given ``client_of``; SGLang and vLLM have no such rule).

A decode step's time grows with the context its requests hold (attention reads every token of
every request, a shared prefix once per request). So one client's many long requests make every
step slow for everyone beside them: 32 requests of one cached 32k prompt make a step ~56 ms where
a small request alone takes ~6 ms. While requests of two or more clients are in the scheduler
(running, being prefilled or waiting), each client's running requests may hold at most
``share_tokens / clients`` context tokens (prompt plus output so far), and always one request:

- admission skips the waiting requests of a client that would go over its share (the others
  keep their order and SGLang's rule of stopping at the first that does not fit);
- when a client under its share has a request waiting, the requests of clients over their share
  are retracted, newest first, as SGLang retracts under memory pressure (their KV freed, their
  cached prefix kept in the cache, their output kept; they wait at the back of the queue and
  resume once the share allows, recomputing only what the cache lost).

With one client (or none), nothing changes: the scheduler behaves as SGLang's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

import attrs

from schedkit.components.scheduler.prefill_adder import PrefillAdder
from schedkit.core.schedule_batch import Req

__all__ = ["ClientShare", "context_tokens"]


def context_tokens(req: Req) -> int:
    """The tokens a decode step of ``req`` attends to: its prompt and its output so far."""
    return len(req.origin_input_ids) + len(req.output_ids)


@attrs.define(slots=True, kw_only=True)
class ClientShare:
    """Each client's share of the running context; see the module docstring."""

    client_of: Callable[[Req], Hashable]
    share_tokens: int
    # Per client, the running context counted by the last ``plan`` and what admission added.
    _held: dict[Hashable, int] = attrs.field(init=False, factory=dict)
    _active: set[Hashable] = attrs.field(init=False, factory=set)
    _share: int = attrs.field(init=False, default=0)

    def plan(self, running: list[Req], chunked: Req | None, waiting: Iterable[Req]) -> list[Req]:
        """Count each client's running context for this admission pass; the running requests
        to retract (newest first) so that a waiting client under its share gets room. Empty,
        and no client limited, while fewer than two clients have requests in the scheduler."""
        client_of = self.client_of
        held: dict[Hashable, int] = {}
        mine: dict[Hashable, list[Req]] = {}
        for req in running:
            client = client_of(req)
            held[client] = held.get(client, 0) + context_tokens(req)
            mine.setdefault(client, []).append(req)
        if chunked is not None:
            client = client_of(chunked)
            held[client] = held.get(client, 0) + context_tokens(chunked)
        waiting_clients = {client_of(req) for req in waiting}
        active = held.keys() | waiting_clients
        if len(active) < 2:
            self._held, self._active, self._share = {}, set(), 0
            return []
        share = self._share = self.share_tokens // len(active)
        self._held, self._active = held, active
        if not any(held.get(client, 0) < share for client in waiting_clients):
            return []
        retract: list[Req] = []
        for client, reqs in mine.items():
            context = held[client]
            while context > share and len(reqs) > 1:
                req = reqs.pop()  # the running batch keeps admission order: newest last
                context -= context_tokens(req)
                retract.append(req)
            held[client] = context
        return retract

    def defers(self, req: Req) -> bool:
        """Whether ``req``'s client holds more running context than another client with
        requests in the scheduler (its admission, or its next chunk, waits for that one)."""
        if not self._share:
            return False
        client = self.client_of(req)
        held = self._held
        mine = held.get(client, 0)
        return any(held.get(other, 0) < mine for other in self._active if other != client)

    def admit(
        self,
        adder: PrefillAdder,
        waiting: list[Req],
        calc_priority: Callable[[list[Req]], None],
        whole_only: bool = False,
    ) -> int:
        """Admit waiting requests through ``adder`` until the first that does not fit: the
        requests of clients under their share, ordered by ``calc_priority`` (the policy; the
        others are not looked at, nor matched against the cache), then lightest client first
        (least running context; the order stable). A request is skipped when it would take its
        client over its share (a client with nothing running takes one whatever its size), or
        when its client holds more running context than another client with requests in the
        scheduler. ``whole_only``: only requests whose whole prompt fits the chunk left (no new
        chunked request). The admitted requests are moved to the front of ``waiting``, then
        come the other candidates, then the skipped ones (each part in its order); returns how
        many were admitted."""
        share, held, client_of = self._share, self._held, self.client_of
        if not share:
            calc_priority(waiting)
            return adder.add_in_order(waiting)
        candidates: list[Req] = []
        skipped: list[Req] = []
        for req in waiting:
            (candidates if held.get(client_of(req), 0) < share else skipped).append(req)
        calc_priority(candidates)
        candidates.sort(key=lambda req: held.get(client_of(req), 0))
        admitted: list[Req] = []
        for req in candidates:
            if not adder.budget_left():
                break
            client = client_of(req)
            context = held.get(client, 0)
            if context and context + context_tokens(req) > share:  # one request at least
                continue
            if whole_only and not adder.fits_whole(req):
                continue
            if self.defers(req):
                continue
            if not adder.add_one_req(req):
                break
            held[client] = context + context_tokens(req)
            admitted.append(req)
        chosen = set(admitted)
        waiting[:] = admitted + [r for r in candidates if r not in chosen] + skipped
        return len(admitted)
