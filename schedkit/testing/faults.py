"""A KV-event publisher that misbehaves on purpose, for testing a router's gap, duplicate,
reorder and restart handling against real ZeroMQ sockets.

``FaultyPublisher`` speaks the real protocol (live PUB frames ``[topic, seq, payload]``, a
replay ROUTER with the epoch query) and sends each batch at once from the caller's thread.
Faults apply to the batches that follow the call that asks for them::

    pub = FaultyPublisher()                  # loopback, free ports
    pub.wait_subscribed()                    # a subscriber is connected
    pub.publish(batch)                       # seq 0, as usual
    pub.publish_raw(payload)                 # any bytes as the next seq's payload
    pub.drop(2)                              # seqs 1-2 never go out live (replay has them)
    pub.drop(1, from_replay=True)            # seq 3 is gone for good
    pub.duplicate()                          # the next batch goes out twice
    pub.hold(3); ...; pub.release(reverse=True)   # delay three batches, send them reordered
    pub.restart()                            # a new publisher: new epoch, seq 0 again
    pub.next_seq = 2                         # the same publisher sends old seqs again
    pub.burst(batches)                       # send many at once: past the HWM, some are lost

The ``faulty_kv_publisher`` pytest fixture (schedkit's plugin) makes them and shuts them down.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterable

import zmq

from schedkit.endpoints import unpredictable_routing_ids
from schedkit.kv_events.config import KvEventsConfig, bind_or_connect, offset_endpoint
from schedkit.kv_events.replay import ReplayServer, replay_send_hwm
from schedkit.kv_events.structs import AllBlocksCleared, EventBatch, KVEventBatch, get_profile

__all__ = ["FaultyPublisher"]


class FaultyPublisher:
    """A KV-event publisher with injectable faults; see the module docstring.

    Its endpoints follow ``ZmqEventPublisher``'s rules, with the same errors: tcp binds on
    loopback only unless ``allow_remote``, rank ``dp_rank`` on port + ``dp_rank``, ``mode``
    bind or connect for the live socket. ``sent`` lists the seqs in the order they went out
    live (duplicates included). Batches without a rank get ``dp_rank``.
    """

    def __init__(self, config: KvEventsConfig | None = None, dp_rank: int = 0) -> None:
        self.dp_rank = dp_rank
        self.config = config or KvEventsConfig(
            endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0"
        )
        self._encode = get_profile(self.config.profile).encode
        self._topic = self.config.topic.encode()
        self.replay_endpoint: str | None = None
        self._replay: ReplayServer | None = None
        self.sent: list[int] = []
        self._drop = 0
        self._drop_from_replay = False
        self._duplicate = 0
        self._hold = 0
        self._held: list[tuple[int, bytes]] = []
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.XPUB)  # a PUB that also hears subscriptions
        self._pub.setsockopt(zmq.SNDHWM, self.config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        try:
            # The same endpoint rules and errors as ZmqEventPublisher: loopback unless
            # allow_remote, tcp port + dp_rank.
            self.endpoint = bind_or_connect(
                self._pub,
                offset_endpoint(self.config.endpoint, dp_rank),
                self.config.mode,
                allow_remote=self.config.allow_remote,
            )
            self._start_epoch()
        except BaseException:
            self._pub.close(linger=0)
            self._context.term()
            raise

    def _start_epoch(self) -> None:
        if self.config.replay_endpoint is not None:
            unpredictable_routing_ids()  # before the ROUTER draws its first peer id
            # In the process-wide context, as on ZmqEventPublisher: zmq_ctx_term can hang on
            # a closed ROUTER that held replies for clients that left.
            router = zmq.Context.instance().socket(zmq.ROUTER)
            # A whole replay fits in a client's queue, as on ZmqEventPublisher's socket:
            # otherwise a client that reads a long replay slowly is dropped as stalled.
            router.setsockopt(zmq.SNDHWM, replay_send_hwm(self.config.buffer_steps))
            # A restart binds again where the first epoch was bound.
            endpoint = self.replay_endpoint or offset_endpoint(
                self.config.replay_endpoint, self.dp_rank
            )
            self.replay_endpoint = self._bind_replay(router, endpoint)
            self._replay = ReplayServer(
                router,
                self.replay_endpoint,
                self._topic,
                self.config.buffer_steps,
                epoch=os.urandom(8),
            )
            self._replay.start()
        self.next_seq = 0

    def _bind_replay(self, router: zmq.Socket, endpoint: str) -> str:
        # After a restart the old replay socket may hold the port for a moment.
        deadline = time.monotonic() + 2.0
        while True:
            try:
                return bind_or_connect(
                    router, endpoint, "bind", allow_remote=self.config.allow_remote
                )
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                    router.close(linger=0)
                    raise
            except BaseException:
                router.close(linger=0)
                raise
            time.sleep(0.01)

    def wait_subscribed(self, timeout: float = 5.0) -> None:
        """Wait until a subscriber's subscription to the topic arrives (then what is
        published reaches it); raise TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._pub.poll(int(left * 1000) + 1):
                raise TimeoutError(f"no subscriber subscribed to {self.endpoint} in {timeout}s")
            message = self._pub.recv()
            if message[:1] == b"\x01" and self._topic.startswith(message[1:]):
                return

    def publish(self, batch: EventBatch) -> int:
        """Send ``batch`` under the next seq, with whatever fault is pending; returns the seq."""
        if batch.attn_dp_rank is None:
            batch.attn_dp_rank = self.dp_rank
        return self.publish_raw(self._encode(batch))

    def publish_raw(self, payload: bytes) -> int:
        """Send ``payload`` as it is (any bytes: another engine's encoding, a malformed batch)
        under the next seq, with whatever fault is pending; returns the seq."""
        seq = self.next_seq
        self.next_seq += 1
        seq_bytes = seq.to_bytes(8, "big")
        dropped_for_good = self._drop and self._drop_from_replay
        if self._replay is not None and not dropped_for_good:
            self._replay.add(seq, seq_bytes, payload)
        if self._drop:
            self._drop -= 1
            return seq
        if self._hold:
            self._hold -= 1
            self._held.append((seq, payload))
            return seq
        self._send(seq, payload)
        if self._duplicate:
            self._duplicate -= 1
            self._send(seq, payload)
        return seq

    def _send(self, seq: int, payload: bytes) -> None:
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self.sent.append(seq)

    def drop(self, n: int = 1, *, from_replay: bool = False) -> None:
        """The next ``n`` batches never go out live; with ``from_replay`` the replay socket
        does not have them either (history lost)."""
        self._drop, self._drop_from_replay = n, from_replay

    def duplicate(self, n: int = 1) -> None:
        """Each of the next ``n`` batches goes out twice."""
        self._duplicate = n

    def hold(self, n: int) -> None:
        """Keep the next ``n`` batches back (a delay) until ``release``."""
        self._hold = n

    def release(self, *, reverse: bool = False) -> None:
        """Send the held batches, in order or (``reverse``) reordered."""
        held, self._held, self._hold = self._held, [], 0
        for seq, payload in reversed(held) if reverse else held:
            self._send(seq, payload)

    def burst(self, batches: Iterable[EventBatch]) -> None:
        """Publish ``batches`` back to back: more than the HWM and a slow subscriber's
        queue overflows (ZeroMQ drops the rest for it)."""
        for batch in batches:
            self.publish(batch)

    def restart(self) -> None:
        """Become a new publisher on the same endpoints: a new epoch, an empty replay ring,
        seq 0 again, and the ``AllBlocksCleared`` a fresh cache announces first."""
        if self._replay is not None:
            self._replay.stop(timeout=5.0)
            self._replay = None
        self._held, self._hold, self._drop, self._duplicate = [], 0, 0, 0
        self._start_epoch()
        self.publish(KVEventBatch(0.0, [AllBlocksCleared()]))

    def shutdown(self) -> None:
        """Close the sockets."""
        if self._replay is not None:
            self._replay.stop(timeout=5.0)
            self._replay = None
        self._pub.close(linger=0)
        self._context.term()
