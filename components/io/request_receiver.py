"""Request receivers: where the scheduler's new requests and control requests come from.

``recv_requests()`` returns what arrived since the last call, without blocking: scheduler
``Req``s and ``ControlRequest``s. ``wait(timeout)`` sleeps until something arrives (the host
loop's sleep-on-idle). ``InprocRequestReceiver`` is a queue filled with ``put``;
``schedkit.components.io.zmq_server`` takes them from the network (and sends outputs back).
"""

from __future__ import annotations

import threading
from collections import deque

import attrs

from schedkit.components.io.io_struct import ControlRequest
from schedkit.core.component import component
from schedkit.core.schedule_batch import Req

__all__ = ["ControlRequest", "InprocRequestReceiver"]


@component("inproc_request_receiver")
class InprocRequestReceiver:
    """A thread-safe in-process queue of requests.

    ``put`` may be called from any thread; ``recv_requests`` drains the queue in arrival order.
    """

    _queue: deque[Req | ControlRequest] = attrs.field(init=False, factory=deque)
    _arrived: threading.Event = attrs.field(init=False, factory=threading.Event)

    def put(self, item: Req | ControlRequest) -> None:
        """Queue a request or a control request."""
        if not isinstance(item, (Req, ControlRequest)):
            raise TypeError(f"put takes a Req or a ControlRequest, got {type(item).__name__}")
        self._queue.append(item)
        self._arrived.set()

    def recv_requests(self) -> list[Req | ControlRequest]:
        """Everything queued since the last call (an empty list when nothing was)."""
        queue = self._queue
        if not queue:
            return []
        self._arrived.clear()
        items = []
        while queue:
            items.append(queue.popleft())
        return items

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until a request is queued; True if one is."""
        return bool(self._queue) or self._arrived.wait(timeout)

    def close(self) -> None:
        """Drop whatever is still queued."""
        self._queue.clear()
