"""How the live fleet sends requests to its workers: outboxes, request messages, aborts."""

from __future__ import annotations

import contextlib

import zmq

from schedkit.components.io.io_struct import (
    ControlReq,
    GenerateReqInput,
    SamplingParamsInput,
    encode,
)
from schedkit.core.schedule_batch import Req

__all__ = ["LiveSending"]


class LiveSending:
    """``_deliver``, ``_flush``, ``_request_message`` and ``_abort`` of ``LiveFleet``: a
    routed request goes out on its worker's DEALER, through that worker's outbox while the
    socket's queue is full. Mixed into ``LiveFleet``.

    Uses the fleet's requests in flight (``_inflight``, ``_aborting``, ``_load``,
    ``_sent_at``), ``routed``, ``_outboxes``, ``_dealers``, ``_poller``, ``alive``,
    ``_doomed``, ``_on_route``, ``dispatcher``, ``_elapsed`` and ``_end``.
    """

    __slots__ = ()

    def _deliver(self, rank: int, req: Req) -> bool:
        """Send ``req`` to worker ``rank``. When its socket's queue is full (the worker reads
        more slowly than requests come), the request waits in that worker's outbox here and
        goes out as the socket takes it; it is in flight on that worker from now on."""
        self._inflight[req.rid] = (rank, req)
        self._load[rank] += 1
        self.routed[rank] += 1
        outbox = self._outboxes[rank]
        outbox.append(req)
        if len(outbox) == 1:
            self._flush(rank)
        if self._on_route is not None:
            self._on_route(self, sum(self.routed))
        return True

    def _flush(self, rank: int) -> None:
        """Send what waits in worker ``rank``'s outbox while its socket takes it; a socket
        error other than a full queue takes the worker out."""
        outbox, dealer = self._outboxes[rank], self._dealers[rank]
        while outbox:
            req = outbox[0]
            if self._inflight.get(req.rid, (None,))[0] != rank:  # it ended meanwhile
                outbox.popleft()
                continue
            try:
                dealer.send(self._request_message(req), zmq.NOBLOCK)
            except zmq.Again:
                break
            except zmq.ZMQError as exc:
                self._doomed.setdefault(rank, f"request socket error: {exc.strerror}")
                break
            outbox.popleft()
            self._sent_at[req.rid] = self._elapsed()
        events = zmq.POLLIN | (zmq.POLLOUT if outbox else 0)
        if self.alive[rank]:
            self._poller.modify(dealer, events)

    def _request_message(self, req: Req) -> bytes:
        """The message that sends ``req`` to a worker."""
        return encode(_generate_message(req))

    def _abort(self, rank: int, req: Req) -> None:
        """``req`` timed out on worker ``rank`` before its first token: abort it there and
        end it here."""
        with contextlib.suppress(zmq.ZMQError):
            self._dealers[rank].send(encode(ControlReq(type="abort", rid=req.rid)), zmq.NOBLOCK)
        self._aborting.add(req.rid)
        self._inflight.pop(req.rid)
        self._load[rank] -= 1
        self._end(req, rank, self.dispatcher.ended(req))


def _generate_message(req: Req) -> GenerateReqInput:
    """The ``GenerateReqInput`` a worker gets for ``req``: its packed prompt as a list, every
    field the worker's scheduler reads (its cache namespace too, or the worker's KV events
    would not hash as the router does), streamed so that the router sees the first token."""
    params = req.sampling_params
    return GenerateReqInput(
        rid=req.rid,
        input_ids=req.origin_input_ids.tolist(),
        sampling_params=SamplingParamsInput(
            max_new_tokens=params.max_new_tokens,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=params.ignore_eos,
            stream=True,
            stream_interval=params.stream_interval,
            min_new_tokens=params.min_new_tokens,
        ),
        priority=req.priority,
        extra_key=req.extra_key,
        cache_salt=req.cache_salt,
    )
