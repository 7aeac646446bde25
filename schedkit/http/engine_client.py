"""The front end's side of the scheduler's ZeroMQ edge: one DEALER connection
(``scheduler_link``), read on the event loop, and admission that is fair between API keys.

Requests handed to the scheduler and not yet finished ("forwarded") are bounded in number and
prompt tokens (``Limits.max_forwarded_*``), and per key: at most ``max_forwarded_per_key``,
and at most ``max_key_lead`` more than the key with the fewest in flight, so that one key's
flood can neither make the running batch, and with it every step, arbitrarily large for the
others, nor keep adding prefill steps in front of each token of another key's request. Those
the scheduler has not admitted into a batch yet are bounded in number and prompt tokens
(``max_scheduler_waiting``, ``max_scheduler_waiting_tokens``; estimated from the load the
scheduler attaches to outputs and from ``get_loads`` polled every ``load_poll_seconds`` while
requests are queued here, plus what was forwarded since): the scheduler's own queue stays
short, so its policy cannot put a small request behind a flood, and the prefill step a small
request joins holds few of the flood's prompt tokens. When the scheduler shares its batch
between keys (``scheduler_shares_keys``, as ``schedkit serve --http`` wires it), a request of a
key with none in flight goes past those two budgets at once (one per key; the forwarded bounds
still hold): the scheduler admits the lightest key first, so another key's waiting flood cannot
hold that request back, and held here until the step in progress reports, it would miss the
next step too. The rest wait here in one queue per key, and a freed slot goes to the queued
key with the fewest requests in flight. Queues are bounded per key and in total.

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
from itertools import islice

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
from schedkit.http.request_state import Overloaded, RequestState
from schedkit.http.scheduler_link import SchedulerLink

__all__ = ["EngineClient", "Overloaded", "RequestState"]

# Control messages the scheduler's zmq_server takes only with its admin token.
_ADMIN_CONTROLS = frozenset({"pause", "continue", "flush"})
_log = logging.getLogger("schedkit.http")
# Queued keys compared for each freed slot.
_SCAN = 32


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
        self.scheduler_shares_keys = scheduler_shares_keys
        self.admin_token = admin_token
        self.limits = limits
        self.states: dict[str, RequestState] = {}
        self.forwarded = 0
        self.forwarded_tokens = 0
        self.queued = 0
        # What the scheduler has not admitted yet: its last report plus what was sent since.
        self.scheduler_waiting = 0
        self.scheduler_waiting_tokens = 0
        # Requests and prompt tokens forwarded so far, and those counts when the last output
        # arrived: a load report counts only what the scheduler had read when it was made.
        self._sent = (0, 0)
        self._sent_at_output = (0, 0)
        self._polling = False
        self._queues: dict[str, deque[RequestState]] = {}
        self._turns: deque[str] = deque()
        self._in_flight: dict[str, int] = {}
        self._in_flight_tokens: dict[str, int] = {}
        self._controls: deque[asyncio.Future] = deque()
        self._prefix = os.urandom(4).hex()
        self._counter = 0
        self._link: SchedulerLink | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Connect (raises ConnectionError or ValueError) and start reading on the running
        loop."""
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
        """A request id unique to this front end."""
        self._counter += 1
        return f"{self._prefix}-{self._counter}"

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
        # With the scheduler sharing between keys, a key with nothing here or there does not
        # wait behind others' queues.
        newcomer = (
            self.scheduler_shares_keys and key not in self._in_flight and key not in self._queues
        )
        if (newcomer or not self._queues) and self._fits(state):
            self.states[rid] = state
            self._forward(state)
            return state
        limits = self.limits
        queue = self._queues.get(key)
        if queue is not None and len(queue) >= limits.max_queued_per_key:
            raise Overloaded(
                429,
                f"this key has {len(queue)} requests queued (max_queued_per_key="
                f"{limits.max_queued_per_key}); send more once some finish",
            )
        if self.queued >= limits.max_queued:
            raise Overloaded(
                503,
                f"the server has {self.queued} requests queued (max_queued={limits.max_queued})",
            )
        if queue is None:
            queue = self._queues[key] = deque()
            self._turns.append(key)
        queue.append(state)
        self.queued += 1
        self.states[rid] = state
        self._pump()
        return state

    def abort(self, state: RequestState) -> None:
        """Drop a request the client no longer wants: unqueue it, or have the scheduler abort
        it and free its KV."""
        if state.done:
            return
        if not state.forwarded:
            queue = self._queues.get(state.key)
            if queue is not None and state in queue:
                queue.remove(state)
                self.queued -= 1
                if not queue:
                    del self._queues[state.key]
                    self._turns.remove(state.key)
            self.states.pop(state.rid, None)
            state.error = "aborted"
            return
        self._controls.append(asyncio.get_running_loop().create_future())
        self._send(encode(ControlReq(type="abort", rid=state.rid)))

    def _fits(self, state: RequestState) -> bool:
        if self.forwarded == 0:
            return True  # one request always fits (the prompt limit bounds its tokens)
        limits = self.limits
        if (
            self.forwarded >= limits.max_forwarded_requests
            or self.forwarded_tokens + state.prompt_tokens > limits.max_forwarded_tokens
        ):
            return False
        if self.scheduler_shares_keys and state.key not in self._in_flight:
            # A key with nothing in the scheduler goes past its waiting budgets: the scheduler
            # admits the lightest key first, so other keys' waiting requests do not hold it
            # back, and held here it would miss the step after the one in progress too.
            return True
        waiting_tokens = self.scheduler_waiting_tokens
        return (
            self.scheduler_waiting < limits.max_scheduler_waiting
            # A prompt longer than the budget goes once the scheduler's queue is empty.
            and (
                waiting_tokens == 0
                or waiting_tokens + state.prompt_tokens <= limits.max_scheduler_waiting_tokens
            )
            and self._within_lead(state.key)
        )

    def _within_lead(self, key: str) -> bool:
        """Whether ``key`` may send one more request: one with none in flight always may;
        else at most ``max_forwarded_per_key``, and at most ``max_key_lead`` requests and
        ``max_key_lead_tokens`` prompt tokens in flight more than the key with the fewest (so
        that, while a light key's request runs, a flood adds no prefill steps in front of
        each of its tokens)."""
        mine = self._in_flight.get(key, 0)
        if mine == 0:
            return True
        limits = self.limits
        if mine >= limits.max_forwarded_per_key:
            return False
        lead = limits.max_key_lead
        if mine >= lead and mine >= min(self._in_flight.values()) + lead:
            return False
        tokens, lead_tokens = self._in_flight_tokens[key], limits.max_key_lead_tokens
        return tokens < lead_tokens or tokens < min(self._in_flight_tokens.values()) + lead_tokens

    def _forward(self, state: RequestState) -> None:
        state.forwarded = True
        self._in_flight[state.key] = self._in_flight.get(state.key, 0) + 1
        tokens = self._in_flight_tokens
        tokens[state.key] = tokens.get(state.key, 0) + state.prompt_tokens
        self.forwarded += 1
        self.scheduler_waiting += 1
        self.scheduler_waiting_tokens += state.prompt_tokens
        requests, tokens = self._sent
        self._sent = (requests + 1, tokens + state.prompt_tokens)
        self.forwarded_tokens += state.prompt_tokens
        message, state.message = state.message, b""
        self._send(message)

    def _pump(self) -> None:
        """Forward queued requests while they fit, each time from the key with the fewest
        requests in flight among the first ``_SCAN`` keys in turn (the earliest among
        equals; when its request does not fit, the slot waits for it rather than going to a
        key with more in flight)."""
        turns, queues, in_flight = self._turns, self._queues, self._in_flight
        while turns:
            # The first keys in turn only: without API keys each connection is a key, and
            # a scan of every queued one would make admission cost grow with the queue.
            key = min(islice(turns, _SCAN), key=lambda k: in_flight.get(k, 0))
            queue = queues[key]
            if not self._fits(queue[0]):
                break
            state = queue.popleft()
            self.queued -= 1
            turns.remove(key)
            if queue:
                turns.append(key)
            else:
                del queues[key]
            self._forward(state)
        if self._queues and not self._polling:
            self._polling = True
            self._loop.create_task(self._poll_loads())

    async def _poll_loads(self) -> None:
        """Ask the scheduler for its load while requests are queued here: its waiting queue
        empties as it admits requests, which no output reports."""
        try:
            while self._queues and self._link is not None:
                await asyncio.sleep(self.limits.load_poll_seconds)
                # The scheduler reads messages in order: the reply counts what went before.
                sent = self._sent
                try:
                    reply = await self.control("get_loads", timeout=5.0)
                except (TimeoutError, ConnectionError):
                    continue
                if reply.loads is not None:
                    self._loaded(reply.loads, sent)
        finally:
            self._polling = False

    def _loaded(self, loads: dict, counted: tuple[int, int]) -> None:
        """Take the scheduler's report of its queue, made once it had read the requests
        counted in ``counted`` (forwarded requests and tokens then): those sent since wait
        too."""
        waiting = loads.get("num_waiting_reqs")
        if isinstance(waiting, int):
            tokens = loads.get("num_waiting_uncached_tokens")
            if not isinstance(tokens, int):
                tokens = 0 if waiting == 0 else self.scheduler_waiting_tokens
            requests_since = self._sent[0] - counted[0]
            tokens_since = self._sent[1] - counted[1]
            self.scheduler_waiting = waiting + requests_since
            self.scheduler_waiting_tokens = tokens + tokens_since
            if self._queues:
                self._pump()

    def _finished(self, state: RequestState) -> None:
        self.states.pop(state.rid, None)
        if state.forwarded:
            left = self._in_flight[state.key] - 1
            if left:
                self._in_flight[state.key] = left
                self._in_flight_tokens[state.key] -= state.prompt_tokens
            else:
                del self._in_flight[state.key]
                del self._in_flight_tokens[state.key]
            self.forwarded -= 1
            self.forwarded_tokens -= state.prompt_tokens
        if self._queues:
            self._pump()

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
            # A step's report counts the requests read when the step began: about those
            # forwarded before the previous step's output arrived.
            counted, self._sent_at_output = self._sent_at_output, self._sent
            if msg.load is not None:
                self._loaded(msg.load, counted)
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
