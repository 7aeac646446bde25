"""Where each live request's outputs go: the connection that sent it, from its arrival to its
final output (None once that connection left), and the prompt tokens waiting in all."""

from __future__ import annotations

import attrs
import structlog

from schedkit.components.io.edge_connections import Connection
from schedkit.components.io.edge_messages import OutputMessage

__all__ = ["Route", "Routes"]

log = structlog.get_logger("schedkit.components.io.zmq_server")


@attrs.define(slots=True, eq=False)
class Route:
    """A live request's client (None once it departed), its prompt tokens, and the user it was
    sent for (``GenerateReqInput.client``)."""

    client: Connection | None
    tokens: int
    user: str | None = None


@attrs.define(slots=True, eq=False)
class Routes:
    """The live requests by rid; counts outputs that had nowhere to go."""

    by_rid: dict[str, Route] = attrs.Factory(dict)
    tokens: int = 0
    unrouted_outputs: int = 0
    departed_outputs: int = 0

    def __len__(self) -> int:
        return len(self.by_rid)

    def __contains__(self, rid: str) -> bool:
        return rid in self.by_rid

    def add(self, client: Connection, rid: str, tokens: int, user: str | None = None) -> None:
        """Route ``rid`` to ``client`` until its final output."""
        self.by_rid[rid] = Route(client, tokens, user)
        client.rids.add(rid)
        client.tokens += tokens
        self.tokens += tokens

    def forget(self, rid: str) -> None:
        """Drop ``rid`` (finished or never handed over) from its client's and the totals."""
        route = self.by_rid.pop(rid)
        self.tokens -= route.tokens
        if route.client is not None:
            route.client.rids.discard(rid)
            route.client.tokens -= route.tokens

    def orphan(self, client: Connection) -> list[str]:
        """Detach ``client``'s live requests (it left); their rids. They stay counted in the
        totals until their final outputs pass."""
        rids = list(client.rids)
        for rid in rids:
            self.by_rid[rid].client = None
        client.rids = set()
        client.tokens = 0
        return rids

    def split(self, msg: OutputMessage) -> dict[Connection, list[int]]:
        """The rows of ``msg`` for each client; rows nobody is to get are counted."""
        by_rid = self.by_rid
        by_client: dict[Connection, list[int]] = {}
        for i, rid in enumerate(msg.rids):
            route = by_rid.get(rid)
            if route is None:
                if not self.unrouted_outputs:
                    log.warning("output of a request no client sent; dropped", rid=rid)
                self.unrouted_outputs += 1
            elif route.client is None:
                self.departed_outputs += 1
            else:
                by_client.setdefault(route.client, []).append(i)
        return by_client

    def finished(self, msg: OutputMessage) -> None:
        """Forget the requests that ``msg`` finishes."""
        for rid, reason in zip(msg.rids, msg.finished_reasons, strict=True):
            if reason is not None and rid in self.by_rid:
                self.forget(rid)
