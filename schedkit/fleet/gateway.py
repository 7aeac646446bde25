"""The live fleet behind one internal request endpoint: what ``schedkit fleet --http`` puts
behind its HTTP front end, as SGLang's data-parallel controller sits between its tokenizer
manager and its schedulers.

``FleetGateway`` binds a ROUTER socket (an ``ipc://`` path in a private directory, or
loopback) that speaks the scheduler ``zmq_server``'s messages, so the HTTP front end of
``schedkit serve --http`` connects to it unchanged. Each ``GenerateReqInput`` becomes a
request of the live fleet: the admission control and the ``--router`` policy over the live
KV-event index choose its worker, and it is sent there as the client sent it (streamed, so
the router sees its first token). The worker's outputs go back to the client that sent the
request (as they came when they concern that client's requests only); a request the fleet
ends itself (refused, timed out, failed with its worker) gets an ``ErrorReply`` naming why.

Control messages are answered in the order they came: ``get_loads`` with the fleet's
figures (requests on the workers before and after their first token, requests at the
router), ``abort`` by taking the request back from the router queue or aborting it on its
worker, and ``pause``, ``continue`` and ``flush`` by sending them to every live worker and
answering once each has (ok when all were). What the workers send is taken in by
``gateway_outputs``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence

import msgspec
import structlog
import zmq

from schedkit.components.io.io_struct import (
    ControlReply,
    ControlReq,
    ErrorReply,
    GenerateReqInput,
    decode_request,
    encode,
    rid_of,
)
from schedkit.core.schedule_batch import FinishAbort, Req
from schedkit.fleet.admission import Outcome
from schedkit.fleet.control_replies import OwedReplies
from schedkit.fleet.gateway_outputs import WorkerOutputs
from schedkit.fleet.live import LiveFleet

__all__ = ["FleetGateway"]

log = structlog.get_logger(__name__)

# Messages taken from the front end per poll, so that outputs interleave with a burst.
_MAX_TAKEN = 256
# A generation request of the longest prompt the decoder takes, with room to spare.
MAX_MESSAGE_BYTES = 64 << 20
OUTCOMES = ("done", "failed", "refused", "timed_out", "aborted")


class FleetGateway(WorkerOutputs, LiveFleet):
    """A live fleet (``LiveFleet``'s arguments) taking requests on ``endpoint`` until
    ``serve(stop)`` sees ``stop()``; ``bound_endpoint`` is where it listens."""

    def __init__(
        self,
        file: str | os.PathLike,
        num_workers: int,
        policy: str = "kv",
        *,
        endpoint: str,
        overlays: Sequence[str | os.PathLike | Mapping] = (),
        **kwargs,
    ) -> None:
        super().__init__(file, num_workers, policy, overlays=overlays, **kwargs)
        self.endpoint = endpoint
        self.bound_endpoint: str | None = None
        self.outcomes = {name: [0] * num_workers for name in OUTCOMES}
        self.router_outcomes = {name: 0 for name in ("failed", "refused", "timed_out", "aborted")}
        self.prompt_tokens = [0] * num_workers
        self.cached_tokens = [0] * num_workers
        self.generated_tokens = [0] * num_workers
        self.indexed_blocks = [0] * num_workers  # the router's index, per worker
        self._server: zmq.Socket | None = None
        self._clients: dict[str, bytes] = {}  # rid -> the identity of the client that sent it
        self._messages: dict[str, bytes] = {}  # rid -> the message that sends it to a worker
        self._withdrawn: set[str] = set()  # aborted by their client
        self._replies = OwedReplies()
        self._payload = b""
        # While a worker's outputs are taken in: errors that go out after them.
        self._held_errors: list[tuple[bytes, ErrorReply]] | None = None
        self._snapshot: tuple[list[int], list[int], int] = ([0] * num_workers,) * 2 + (0,)

    def _start(self) -> None:
        """Start the workers and the router, then listen on ``endpoint``."""
        super()._start()
        server = self._context.socket(zmq.ROUTER)
        server.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        server.setsockopt(zmq.LINGER, 0)
        server.setsockopt(zmq.SNDHWM, 0)  # bounded by what the front end forwards
        server.setsockopt(zmq.RCVHWM, 0)
        server.bind(self.endpoint)
        self.bound_endpoint = server.getsockopt_string(zmq.LAST_ENDPOINT)
        self._server = server
        self._poller.register(server, zmq.POLLIN)
        self._socket_handlers[server] = self._take_requests

    # ---- serving ------------------------------------------------------------------------

    def serve(self, stop: Callable[[], bool]) -> None:
        """Route requests until ``stop()`` is true (checked at least every 50 ms)."""
        start = self._begin()
        while not stop():
            now = time.monotonic()
            elapsed = now - start
            self.dispatcher.expire(elapsed)
            sampled = self._next_load
            wait = self._housekeep(now, elapsed)
            if self._next_load != sampled:  # the loads were just sampled: the figures too
                self._snapshot = self._count_in_flight()
                index = self.router.index
                self.indexed_blocks = [index.num_blocks(r) for r in range(self.num_workers)]
            self._poll(wait)

    def in_flight(self) -> tuple[list[int], list[int], int]:
        """Per worker, requests with no first token and with one, and requests at the router,
        as of the last load query (every ``load_interval`` s); safe from another thread."""
        return self._snapshot

    def _count_in_flight(self) -> tuple[list[int], list[int], int]:
        waiting, running = [0] * self.num_workers, [0] * self.num_workers
        for rank, req in self._inflight.values():
            if req.first_token_time is None:
                waiting[rank] += 1
            else:
                running[rank] += 1
        return waiting, running, len(self.dispatcher.queue)

    def loads(self) -> dict:
        """The fleet's load as a scheduler's ``get_loads`` reports its own; its waiting
        tokens are the whole prompts of the requests with no first token (the router does
        not know how much of each a worker has cached: an upper bound)."""
        waiting, running = 0, 0
        waiting_tokens = self.dispatcher.queued_tokens
        for _, req in self._inflight.values():
            if req.first_token_time is None:
                waiting += 1
                waiting_tokens += len(req.origin_input_ids)
            else:
                running += 1
        queued = len(self.dispatcher.queue)
        return {
            "num_running_reqs": running,
            "num_waiting_reqs": waiting + queued,
            "num_waiting_uncached_tokens": waiting_tokens,
            "num_total_tokens": sum(self.dispatcher.held_tokens),
            "num_workers": len(self.router.ranks),
            "router_queue_reqs": queued,
        }

    # ---- from the front end -------------------------------------------------------------

    def _take_requests(self) -> None:
        server = self._server
        for _ in range(_MAX_TAKEN):
            try:
                frames = server.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                log.warning("fleet.bad_client_message", frames=len(frames))
                continue
            identity, payload = frames
            try:
                msg = decode_request(payload)
            except (msgspec.DecodeError, RecursionError) as exc:
                error = ErrorReply(message=f"bad request: {str(exc)[:300]}", rid=rid_of(payload))
                self._send(identity, error)
                continue
            if isinstance(msg, GenerateReqInput):
                self._arrive(identity, msg)
            else:
                self._control(identity, msg)

    def _arrive(self, identity: bytes, msg: GenerateReqInput) -> None:
        rid = msg.rid
        if rid in self._clients or rid in self._inflight:
            self._send(identity, ErrorReply(message=f"rid {rid!r} is already in flight", rid=rid))
            return
        # Streamed to the worker whatever the client asked: the router needs the first token.
        streamed = msgspec.structs.replace(msg.sampling_params, stream=True)
        msg = msgspec.structs.replace(msg, sampling_params=streamed)
        req = msg.to_req()
        req.arrival_time = self._elapsed()
        self._clients[rid] = identity
        self._messages[rid] = encode(msg)
        self.dispatcher.arrive(req)

    def _request_message(self, req: Req) -> bytes:
        return self._messages[req.rid]

    def _control(self, identity: bytes, msg: ControlReq) -> None:
        if msg.type == "abort":
            if msg.rid is not None:
                self._withdraw(msg.rid)
            self._replies.owe(identity, msg.type)
        elif msg.type == "get_loads":
            self._replies.owe(identity, msg.type)  # the loads as of when it is sent
        else:  # pause, continue, flush: every live worker
            reply = self._replies.owe(identity, msg.type)
            forward = encode(ControlReq(type=msg.type, mode=msg.mode, token=self.admin_token))
            for rank in self.router.ranks:
                try:
                    self._dealers[rank].send(forward, zmq.NOBLOCK)
                    reply.waiting.add(rank)
                except zmq.ZMQError as exc:
                    reply.failed(f"worker {rank}: {exc.strerror}")
        self._answer()

    def _withdraw(self, rid: str) -> None:
        """The client gave up on ``rid``: out of the router queue, out of a worker's outbox,
        or aborted on its worker (which then sends its last output)."""
        if rid not in self._clients:
            return
        self._withdrawn.add(rid)
        entry = self._inflight.get(rid)
        if entry is None:
            req = self.dispatcher.withdraw(rid)
            if req is not None:
                req.finished_reason = FinishAbort(message="aborted by its client")
                self._end(req, None, "aborted")
            return
        rank, req = entry
        outbox = self._outboxes[rank]
        if req in outbox:  # never sent: ended here
            outbox.remove(req)
            del self._inflight[rid]
            self._load[rank] -= 1
            req.finished_reason = FinishAbort(message="aborted by its client")
            self._end(req, rank, self.dispatcher.ended(req))
        else:
            try:
                self._dealers[rank].send(encode(ControlReq(type="abort", rid=rid)), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                log.warning("fleet.abort_not_sent", worker=rank, rid=rid, error=exc.strerror)

    def _answer(self) -> None:
        """Send the control replies that are ready, in the order their requests came."""
        for reply in self._replies.ready():
            loads = None
            if reply.kind == "get_loads":
                loads = self.loads()
                reply.ok = loads["num_workers"] > 0
            message = "; ".join(reply.messages) or None
            out = ControlReply(type=reply.kind, ok=reply.ok, loads=loads, message=message)
            self._send(reply.identity, out)

    def _send(self, identity: bytes, msg: msgspec.Struct | bytes) -> None:
        payload = msg if isinstance(msg, bytes) else encode(msg)
        try:
            self._server.send_multipart([identity, payload], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the client is gone (or unknown): nobody to tell
            log.warning("fleet.client_unreachable", error=exc.strerror)

    # ---- ends ---------------------------------------------------------------------------

    def _end(self, req: Req, rank: int | None, outcome: Outcome) -> None:
        """A request ended: counted, forgotten, and its client told why when it did not
        finish on a worker."""
        rid = req.rid
        req.finished_output = True
        self.router.finished(rid)
        self._messages.pop(rid, None)
        identity = self._clients.pop(rid, None)
        if rid in self._withdrawn:
            self._withdrawn.discard(rid)
            outcome = "aborted"
        if rank is None:
            self.router_outcomes[outcome] += 1
        else:
            self.outcomes[outcome][rank] += 1
        if outcome not in ("done", "aborted") and identity is not None:
            reason = req.finished_reason
            message = reason.message if isinstance(reason, FinishAbort) else outcome
            error = ErrorReply(message=message, rid=rid)
            if self._held_errors is not None:
                self._held_errors.append((identity, error))
            else:
                self._send(identity, error)

    # ---- stopping -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop listening, then stop the workers (``LiveFleet.close``)."""
        server, self._server = self._server, None
        if server is not None:
            if self._socket_handlers.pop(server, None) is not None:
                self._poller.unregister(server)
            server.close(linger=0)
        super().close()
