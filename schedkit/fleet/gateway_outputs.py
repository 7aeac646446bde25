"""What the fleet gateway takes from its workers: outputs relayed to the clients that sent the
requests (with the finished requests' token counts), control replies, a worker taken out.
Mixed into ``FleetGateway``."""

from __future__ import annotations

import structlog

from schedkit.components.io.io_struct import BatchTokenIDOutput, ControlReply

__all__ = ["WorkerOutputs"]

# The gateway's logger: its records name the gateway whichever part of it logs.
log = structlog.get_logger("schedkit.fleet.gateway")


class WorkerOutputs:
    """``_receive``, ``_control_reply``, ``_outputs`` and ``_mark_dead`` of ``FleetGateway``
    (each calling on to ``LiveFleet``'s where it has one).

    Uses the gateway's clients (``_clients``), requests in flight (``_inflight``), owed
    control replies (``_replies``, ``_answer``), ``loads``, ``_send`` and the token totals
    (``prompt_tokens``, ``cached_tokens``, ``generated_tokens``); sets ``_payload`` and
    ``_held_errors``.
    """

    __slots__ = ()

    def _receive(self, rank: int, payload: bytes, now: float) -> None:
        self._payload = payload
        super()._receive(rank, payload, now)

    def _control_reply(self, rank: int, msg: ControlReply) -> None:
        if msg.type in ("pause", "continue", "flush"):
            self._replies.answered(rank, msg.type, msg.ok, msg.message)
            self._answer()

    def _outputs(self, rank: int, msg: BatchTokenIDOutput, now: float) -> None:
        groups = self._group(rank, msg)  # before the requests that end here are forgotten
        held = self._held_errors = []
        try:
            super()._outputs(rank, msg, now)
        finally:
            self._held_errors = None
        self._relay(rank, msg, groups)
        for identity, error in held:  # after the outputs they follow
            self._send(identity, error)

    def _group(self, rank: int, msg: BatchTokenIDOutput) -> dict[bytes, list[int]]:
        """The indexes of ``msg``'s requests per client (those in flight on ``rank``)."""
        clients, inflight = self._clients, self._inflight
        groups: dict[bytes, list[int]] = {}
        for i, rid in enumerate(msg.rids):
            identity = clients.get(rid)
            entry = inflight.get(rid)
            if identity is None or entry is None or entry[0] != rank:
                continue
            groups.setdefault(identity, []).append(i)
            if msg.finished_reasons[i] is not None:
                self._count_finished(rank, msg, i)
        return groups

    def _relay(self, rank: int, msg: BatchTokenIDOutput, groups: dict[bytes, list[int]]) -> None:
        """Send each client the outputs of its requests from worker ``rank``: the message as
        it came when all of it is for one client, else one message per client."""
        n = len(msg.rids)
        # A worker attaches its load when a request finished; the client gets the fleet's.
        load = None if msg.load is None else self.loads()
        for identity, picked in groups.items():
            if len(picked) == n and load is None:
                self._send(identity, self._payload)
                continue

            def pick(column: list, picked: list[int] = picked) -> list:
                return [column[i] for i in picked] if len(column) == n else []

            part = BatchTokenIDOutput(
                rids=pick(msg.rids),
                finished_reasons=pick(msg.finished_reasons),
                output_ids=pick(msg.output_ids),
                prompt_tokens=pick(msg.prompt_tokens),
                completion_tokens=pick(msg.completion_tokens),
                cached_tokens=pick(msg.cached_tokens),
                cached_tokens_details=pick(msg.cached_tokens_details),
                dp_rank=rank,
                load=load,
            )
            self._send(identity, part)

    def _count_finished(self, rank: int, msg: BatchTokenIDOutput, i: int) -> None:
        for column, totals in (
            (msg.prompt_tokens, self.prompt_tokens),
            (msg.cached_tokens, self.cached_tokens),
            (msg.completion_tokens, self.generated_tokens),
        ):
            if len(column) == len(msg.rids):
                totals[rank] += column[i]

    def _mark_dead(self, rank: int, why: str) -> None:
        super()._mark_dead(rank, why)
        log.warning("fleet.worker_taken_out", worker=rank, why=why)
        self._replies.lost(rank, why)
        self._answer()
