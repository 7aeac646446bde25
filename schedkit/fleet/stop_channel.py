"""The parent's end of the live fleet workers' stop: an XPUB on a free loopback port.

Each worker subscribes to its own topic (``schedkit.fleet.worker.stop_topic``) before it
builds anything. The XPUB hands the parent each subscription, so the parent knows when a
stop sent to that worker will reach it (a PUB drops what it sends before a subscriber has
joined): the fleet counts a worker ready only once it has both its ready report and its
subscription, and a worker that subscribes after the fleet began to stop gets its stop then.
"""

from __future__ import annotations

import zmq

from schedkit.fleet.worker import LOOPBACK_ANY_PORT, stop_topic

__all__ = ["StopChannel"]

_SUBSCRIBE = b"\x01"


class StopChannel:
    """Stops for ``num_workers`` workers over one XPUB bound in ``context``."""

    def __init__(self, context: zmq.Context, num_workers: int) -> None:
        self.socket = context.socket(zmq.XPUB)
        self.socket.bind(LOOPBACK_ANY_PORT)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._ranks = {stop_topic(rank): rank for rank in range(num_workers)}
        self.subscribed: set[int] = set()  # workers whose subscription arrived
        self.sent: set[int] = set()  # workers sent their stop
        self.stopping = False

    def take_subscriptions(self) -> None:
        """Note the subscriptions that arrived; once stopping, a worker's stop goes out as
        soon as its subscription arrives."""
        while self.socket.poll(0):
            message = self.socket.recv()
            rank = self._ranks.get(message[1:])
            if message[:1] == _SUBSCRIBE and rank is not None:
                self.subscribed.add(rank)
                if self.stopping:
                    self._send(rank)

    def stop_all(self) -> None:
        """Stop every worker: those subscribed now, the others as they subscribe (call
        ``take_subscriptions`` while waiting for them)."""
        self.stopping = True
        self.take_subscriptions()
        for rank in self.subscribed:
            self._send(rank)

    def _send(self, rank: int) -> None:
        if rank not in self.sent:
            self.sent.add(rank)
            self.socket.send(stop_topic(rank))

    def close(self) -> None:
        """Close the socket."""
        self.socket.close(linger=0)
