"""How ``ZmqServer`` takes requests in: reading within the byte bound, parsing the backlog
in turns by client, the waiting limits and displacement, controls and refusals. Mixed into
``ZmqServer``."""

from __future__ import annotations

import time
from functools import partial

from schedkit.components.io.edge_connections import Connection
from schedkit.components.io.edge_messages import (
    Refusal,
    client_message,
    leading_kind_and_rid,
    shortened,
)
from schedkit.components.io.io_struct import (
    ControlReply,
    ControlReq,
    ControlRequest,
    ErrorReply,
    kind_and_rid,
)
from schedkit.components.io.zmtp import ZmtpMessage
from schedkit.core.schedule_batch import Req

__all__ = ["RequestIntake"]


class RequestIntake:
    """``_read``, ``_parse_backlog``, ``_parse`` and the refusals of ``ZmqServer``.

    Uses the server's ``connections``, backlog (``_backlog``), waiting limits (``_limits``),
    routes (``_routes``), fair release (``_fair``), admin controls (``_admin``), internal
    requests (``_internal``), ``_warnings`` and ``_send``; counts ``malformed_count`` and
    ``displaced_requests``.
    """

    __slots__ = ()

    def _read(self, deadline: float | None) -> bool:
        """Read what readable connections with nothing in the backlog sent, up to the
        backlog's bytes (and ``deadline``, if given); True if the backlog holds anything
        then."""
        table, backlog = self.connections, self._backlog
        room = self.max_recv_bytes_per_call - backlog.bytes
        readable = table.poll(0) if room > 0 else None
        if readable:
            fresh = [conn for conn in readable if conn not in backlog]
            for conn, message in table.read(fresh, room, deadline):
                if not conn.closed:
                    backlog.add(conn, message)
        return bool(backlog)

    def _parse_backlog(self, items: list[Req | ControlRequest], deadline: float) -> bool:
        """Parse backlog messages, one per client in turns, into ``items`` until the backlog
        is empty or ``deadline`` passed (at least one); True if time is left."""
        backlog = self._backlog
        while backlog:
            conn, message = backlog.take()
            if not conn.closed:
                item = self._parse(conn, message)
                if item is not None:
                    items.append(item)
            if time.monotonic() >= deadline:
                return False
        return True

    def _parse(self, client: Connection, message: ZmtpMessage) -> Req | ControlRequest | None:
        full = self._limits.client_full(len(client.rids), client.tokens)
        if full is not None and message.parts == 1 and not message.oversize:
            kind, rid = leading_kind_and_rid(message.last) or kind_and_rid(message.last)
            if kind == "generate":  # refused whatever it holds: not decoded (a flood's cost)
                return self._refuse(client, full, rid)
        msg = client_message(
            message,
            from_req_socket=bool(client.envelope),
            max_message_bytes=self.max_message_bytes,
        )
        if isinstance(msg, Refusal):
            return self._refuse(client, msg.problem, msg.rid)
        if isinstance(msg, ControlReq):
            return self._control(client, msg)
        rid, tokens = msg.rid, len(msg.input_ids)
        if rid in self._routes:
            return self._refuse(client, f"rid {rid!r} is already in flight", rid)
        over = self._limits.client_over(len(client.rids), client.tokens, tokens)
        if over is None:
            over = self._make_room(client, tokens)
        if over is not None:
            return self._refuse(client, over, rid)
        self._routes.add(client, rid, tokens, msg.client)
        self._fair.hold(client, msg.to_req())
        return None

    def _make_room(self, client: Connection, tokens: int) -> str | None:
        """None if the totals take ``tokens`` more, after displacing, while that is fairer,
        the newest held requests of the client with the most waiting; else why not."""
        while True:
            over = self._limits.total_over(len(self._routes), self._routes.tokens, tokens)
            if over is None:
                return None
            fattest = max(self.connections, key=lambda c: len(c.rids))
            victim = self._fair.newest_held(fattest)
            if fattest is client or len(fattest.rids) <= len(client.rids) + 1 or victim is None:
                return over
            self._fair.take(fattest, victim.rid)
            self._routes.forget(victim.rid)
            self.displaced_requests += 1
            self._send(
                fattest,
                ErrorReply(
                    message="displaced before it was scheduled: the server's waiting budget is "
                    "full and other clients have fewer requests waiting; retry later",
                    rid=victim.rid,
                ),
            )

    def _control(self, client: Connection, msg: ControlReq) -> ControlRequest | None:
        if msg.type == "abort":
            if msg.rid not in client.rids:
                return self._refuse(
                    client, f"abort needs the rid of one of your live requests, got {msg.rid!r}"
                )
            held = self._fair.take(client, msg.rid)
            if held is not None:  # the scheduler takes it and aborts it: one final output
                self._internal.append(ControlRequest(type="abort", rid=msg.rid))
                return held
        refusal = self._admin.refusal(msg)
        if refusal is not None:
            self._warnings.warning("control refused", type=msg.type, peer=client.peer)
            self._send(client, ControlReply(type=msg.type, ok=False, message=refusal))
            return None
        self._admin.accepted(client, msg)
        return ControlRequest(
            type=msg.type, mode=msg.mode, rid=msg.rid, send_reply=partial(self._reply, client)
        )

    def _refuse(self, client: Connection, problem: str, rid: str | None = None) -> None:
        self.malformed_count += 1
        problem = shortened(problem)
        self._warnings.warning("request refused", problem=problem, peer=client.peer)
        self._send(client, ErrorReply(message=problem, rid=rid))
        return None

    def _reply(self, client: Connection, reply: ControlReply) -> None:
        if not client.closed:  # else it left: nobody to tell
            self._send(client, reply)
