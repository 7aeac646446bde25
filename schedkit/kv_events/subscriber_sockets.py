"""A KV-event subscriber's sockets: the live SUB socket opened (with a monitor that tells when
it connects again, when there is a replay socket) together with the replay client; live
frames read one by one, dropped, and reconnects noticed; every socket closed together without
lingering, also when the subscriber is garbage-collected unclosed.

``SubscriberSockets`` sits between ``ReplayExchange`` (the questions a live frame raises) and
``KvEventSubscriber`` (its contract: ``poll``, iteration and lifetime).
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref
from collections.abc import Callable

import zmq

from schedkit.kv_events.replay_client import (
    LEARN,
    RECONNECT,
    REPLAY,
    ReplayBounds,
    ReplayClient,
)
from schedkit.kv_events.replay_exchange import ReplayExchange
from schedkit.kv_events.sequencing import LiveFrame
from schedkit.kv_events.structs import KVEventBatch

__all__ = ["SubscriberSockets"]

_MAX_READ = 4096  # live messages handled per poll() call


class SubscriberSockets(ReplayExchange):
    """The subscriber's sockets: opening, reading live frames, reconnects and closing."""

    endpoint: str
    _context: zmq.Context
    _keeps_payloads: bool
    _lock: threading.Lock
    _decode_payload: Callable[[bytes], KVEventBatch | str]

    def _open_sockets(
        self,
        topic: str,
        *,
        hwm: int,
        max_message_bytes: int,
        replay_timeout: float,
        replay_bounds: ReplayBounds | None,
    ) -> None:
        """Connect the live socket (and the replay client, which asks the publisher's epoch
        at once); ``ValueError`` naming the endpoints when ZeroMQ refuses."""
        endpoint, replay_endpoint = self.endpoint, self.replay_endpoint
        self._sub = self._context.socket(zmq.SUB)
        self._replay: ReplayClient | None = None
        self._monitor = None  # tells when the live socket (re)connects
        self._connections = 0
        self._draining = False  # dropping a restarted publisher's queued frames
        self._drain_waits_until = 0.0  # and what its connection may still bring until then
        self._drain_wait = replay_timeout
        # Whatever is open when the subscriber is collected unclosed; see _close_abandoned.
        self._sockets: list[zmq.Socket] = [self._sub]
        self._finalizer = weakref.finalize(self, _close_abandoned, self._sockets, endpoint)
        try:
            self._sub.setsockopt(zmq.LINGER, 0)
            self._sub.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
            self._sub.setsockopt(zmq.RCVHWM, hwm)
            self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
            if replay_endpoint is not None:
                self._monitor = self._sub.get_monitor_socket(zmq.EVENT_CONNECTED)
                self._monitor.setsockopt(zmq.LINGER, 0)
                self._sockets.append(self._monitor)
            self._sub.connect(endpoint)
            if replay_endpoint is not None:
                self._replay = ReplayClient(
                    self._context,
                    replay_endpoint,
                    self._sockets,
                    self.bad_input,
                    timeout=replay_timeout,
                    bounds=replay_bounds or ReplayBounds(),
                    max_message_bytes=max_message_bytes,
                    hwm=hwm,
                    decode=self._decode_payload,
                    keep_payloads=self._keeps_payloads,
                )
                self._ask(LEARN)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ValueError(
                f"KV-event subscriber cannot connect to {endpoint!r} / {replay_endpoint!r}: "
                f"{exc.strerror}"
            ) from exc

    def _close_sockets(self) -> None:
        """Close every socket now, without lingering; the finalizer then has nothing to do."""
        with self._lock:
            sockets = list(self._sockets)
            self._sockets.clear()
        self._finalizer.detach()
        _close_all(sockets)

    # -- live frames ----------------------------------------------------------------------
    # A live frame is read only while no answer is awaited. What its handling needs from the
    # replay socket (the publisher's epoch, missed batches) is asked first, one question at
    # a time, without blocking; _on_live then handles it at once with the answers in hand.

    def _read_live(self, out: list) -> None:
        replay = self._replay
        if self._monitor is not None and self._reconnected():
            # The frames queued from here on may come from a new publisher. An epoch check
            # in flight may have gone to the old one and never be answered; answers are
            # matched to requests by their order, so the new publisher's would be taken for
            # its. It is given up, under a new identity that no late answer reaches.
            if replay.requests:  # epoch checks only: nothing holds live frames here
                replay.give_up()
            self._drain_waits_until = 0.0  # an old connection was read to its end
            self._ask(RECONNECT)
            return
        if self._draining:
            if not self._drop_queued():
                return
            # The new publisher's frames dropped after its replay was answered.
            self._ask(REPLAY, start=0 if self._last is None else self._last + 1)
            return
        sub = self._sub
        for _ in range(_MAX_READ):
            if replay is not None and replay.holding:
                return
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or len(frames[1]) != 8:
                self.bad_input("live_frames", frames=[len(f) for f in frames[:8]])
            else:
                self._frame = LiveFrame(int.from_bytes(frames[1], "big"), frames[2])
                self._prepare(out)
            if time.monotonic() >= self._work_until:
                return

    def _drain_live(self, reconnected: bool) -> None:
        """Drop the live frames queued: this poll call what it may read, the next ones the
        rest before they read anything live. Unless the live socket has just connected again
        (``reconnected``), the old connection may still be bringing in its tail (the queue
        holds ``hwm`` frames): what comes in is dropped until the socket connects again,
        which it does only once it has read the old connection to its end, or until
        ``replay_timeout`` has passed."""
        self._draining = True
        self._drain_waits_until = 0.0 if reconnected else time.monotonic() + self._drain_wait
        self._drop_queued()

    def _drop_queued(self) -> bool:
        """Drop queued live frames until none is left and none is still expected from the
        old connection (True), or this call's reading is spent (False)."""
        for _ in range(_MAX_READ):
            try:
                self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                if time.monotonic() < self._drain_waits_until:
                    return False
                self._draining = False
                return True
            if time.monotonic() >= self._work_until:
                return False
        return False

    def _reconnected(self) -> bool:
        """Whether the live socket connected again since the last call (not the first time)."""
        again = False
        while True:
            try:
                self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return again
            self._connections += 1
            again = again or self._connections > 1


def _close_abandoned(sockets: list[zmq.Socket], endpoint: str) -> None:
    """Close the sockets of a subscriber collected without ``close()``: no linger, no join,
    no context termination, so that it never blocks whatever thread the collector runs on."""
    if not sockets:
        return
    warnings.warn(
        f"KvEventSubscriber for {endpoint} was collected without close(); close() it or use "
        "it as a context manager",
        ResourceWarning,
        stacklevel=2,
    )
    _close_all(sockets)
    sockets.clear()


def _close_all(sockets: list[zmq.Socket]) -> None:
    """Close without lingering; the monitor's reader before the socket it watches."""
    for sock in reversed(sockets):
        sock.close(linger=0)
