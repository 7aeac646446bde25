"""The front end's side of the scheduler's ZeroMQ edge: one DEALER connection
(``scheduler_link``), read on the event loop. Which requests go to the scheduler now and which
wait here, fair between API keys, is ``key_admission``'s; this client polls the scheduler's
load for it while requests wait.

Control messages (pause, continue, flush, loads, abort) are answered by the scheduler in the
order they were sent, each with one ``ControlReply`` or an ``ErrorReply`` without rid; replies
are matched to their futures in that order.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections import deque

import msgspec

from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    ErrorReply,
    GenerateReqInput,
    SamplingParamsInput,
    decode_server_message,
    encode,
)
from schedkit.http.config import Limits
from schedkit.http.key_admission import KeyAdmission
from schedkit.http.request_state import Overloaded, RequestState
from schedkit.http.scheduler_link import SchedulerLink

__all__ = ["EngineClient", "Overloaded", "RequestState"]

# Control messages the scheduler's zmq_server takes only with its admin token.
_ADMIN_CONTROLS = frozenset({"pause", "continue", "flush"})
_log = logging.getLogger("schedkit.http")


def _client_name(key: str) -> str:
    """The name the scheduler shares its batch by for requests of ``key`` (an API key or a
    connection): a digest, so that no key is sent on."""
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


class EngineClient:
    """Requests out and outputs in on one DEALER connected to the scheduler's ``zmq_server``."""

    def __init__(
        self,
        endpoint: str,
        limits: Limits,
        admin_token: str | None = None,
        *,
        scheduler_shares_keys: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.admin_token = admin_token
        self.states: dict[str, RequestState] = {}
        self.admission = KeyAdmission(
            limits,
            scheduler_shares_keys=scheduler_shares_keys,
            send=self._send,
            on_queued=self._poll_while_queued,
        )
        self._polling = False
        self._controls: deque[asyncio.Future] = deque()
        self._prefix = os.urandom(4).hex()
        self._counter = 0
        self._link: SchedulerLink | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Connect (raises ConnectionError or ValueError) and start reading on the running
        loop; nothing once connected."""
        if self._link is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._link = SchedulerLink(self.endpoint, self._dispatch_bytes, self._lost)
        self._link.open(self._loop)

    def close(self) -> None:
        """Close the connection; waiting requests end with an error."""
        if self._link is None:
            return
        self._link.close()
        self._link = None
        self._fail_all("the server is shutting down")

    def _lost(self, reason: str) -> None:
        """The scheduler's connection ended: every request and control waiting ends."""
        _log.error("lost the scheduler connection: %s", reason)
        self._fail_all(f"lost the scheduler connection ({reason})")

    def _fail_all(self, reason: str) -> None:
        for state in list(self.states.values()):
            state.error = reason
            state.wake()
        while self._controls:
            future = self._controls.popleft()
            if not future.done():
                future.set_exception(ConnectionError(reason))

    # -- generation -------------------------------------------------------------------------

    def new_rid(self) -> str:
        """A request id unique to this front end: past any in flight, since a client may
        choose a rid of this form (``/generate``'s ``rid``) before the counter reaches it."""
        while True:
            self._counter += 1
            rid = f"{self._prefix}-{self._counter}"
            if rid not in self.states:
                return rid

    def submit(
        self,
        key: str,
        input_ids: list[int],
        params: SamplingParamsInput,
        rid: str | None = None,
    ) -> RequestState:
        """Send a request now, or queue it under ``key``; raises ``Overloaded`` or ValueError
        (a rid already in flight)."""
        if rid is None:
            rid = self.new_rid()
        elif rid in self.states:
            raise ValueError(f"rid {rid!r} is already in flight")
        message = encode(
            GenerateReqInput(
                rid=rid, input_ids=input_ids, sampling_params=params, client=_client_name(key)
            )
        )
        state = RequestState(rid, key, message, len(input_ids), params.stream)
        self.states[rid] = state
        try:
            self.admission.admit(state)
        except Overloaded:
            del self.states[rid]
            raise
        return state

    def abort(self, state: RequestState) -> None:
        """Drop a request the client no longer wants: unqueue it, or have the scheduler abort
        it and free its KV."""
        if state.done:
            return
        if not state.forwarded:
            self.admission.unqueue(state)
            self.states.pop(state.rid, None)
            # Ended as the scheduler ends an aborted request, and whoever waits for it (an
            # abort from another connection) is woken.
            state.finish = {"type": "abort", "message": "aborted"}
            state.wake()
            return
        self._controls.append(asyncio.get_running_loop().create_future())
        self._send(encode(ControlReq(type="abort", rid=state.rid)))

    def _poll_while_queued(self) -> None:
        if not self._polling:
            self._polling = True
            self._loop.create_task(self._poll_loads())

    async def _poll_loads(self) -> None:
        """Ask the scheduler for its load while requests are queued here: its waiting queue
        empties as it admits requests, which no output reports."""
        try:
            while self.admission.has_queued and self._link is not None:
                await asyncio.sleep(self.admission.limits.load_poll_seconds)
                # The scheduler reads messages in order: the reply counts what went before.
                sent = self.admission.sent
                try:
                    reply = await self.control("get_loads", timeout=5.0)
                except (TimeoutError, ConnectionError):
                    continue
                if reply.loads is not None:
                    self.admission.loaded(reply.loads, sent)
        finally:
            self._polling = False

    def _finished(self, state: RequestState) -> None:
        self.states.pop(state.rid, None)
        self.admission.finished(state)

    # -- control ----------------------------------------------------------------------------

    async def control(
        self, kind: str, mode: str = "retract", timeout: float = 10.0
    ) -> ControlReply:
        """Send a control message and wait for its reply; raises TimeoutError."""
        future = asyncio.get_running_loop().create_future()
        self._controls.append(future)
        token = self.admin_token if kind in _ADMIN_CONTROLS else None
        self._send(encode(ControlReq(type=kind, mode=mode, token=token)))
        # A late reply still pops this future, so replies stay in order after a timeout.
        return await asyncio.wait_for(asyncio.shield(future), timeout)

    # -- the socket -------------------------------------------------------------------------

    def _send(self, payload: bytes) -> None:
        link = self._link
        if link is None:
            raise ConnectionError("the scheduler connection is closed")
        link.send(payload)

    def _dispatch_bytes(self, data: bytes) -> None:
        self._dispatch(decode_server_message(data))

    def _dispatch(self, msg: msgspec.Struct) -> None:
        if isinstance(msg, BatchTokenIDOutput):
            self.admission.output_arrived(msg.load)
            states = self.states
            for i, rid in enumerate(msg.rids):
                state = states.get(rid)
                if state is None:
                    continue
                state.ids += msg.output_ids[i]
                reason = msg.finished_reasons[i]
                if reason is not None:
                    state.finish = msgspec.to_builtins(reason)
                    state.prompt_tokens = msg.prompt_tokens[i]
                    state.completion_tokens = msg.completion_tokens[i]
                    state.cached_tokens = msg.cached_tokens[i]
                    self._finished(state)
                    state.wake()
                elif state.stream:
                    state.wake()
        elif isinstance(msg, ErrorReply) and msg.rid is not None:
            state = self.states.get(msg.rid)
            if state is not None:
                state.error = msg.message
                self._finished(state)
                state.wake()
        elif isinstance(msg, ControlReply | ErrorReply):
            self._reply(msg)

    def _reply(self, msg: ControlReply | ErrorReply) -> None:
        if not self._controls:
            return
        future = self._controls.popleft()
        if future.done():
            return
        if isinstance(msg, ErrorReply):
            msg = ControlReply(type="error", ok=False, message=msg.message)
        future.set_result(msg)
