"""The sockets of a ZeroMQ KV-event publisher: its endpoints checked before anything opens
(``schedkit validate`` runs the check too), the PUB socket bound or connected, and with a
replay endpoint the replay ROUTER and the ``ReplayServer`` that serves it.

tcp endpoints are bound on loopback only, unless ``allow_remote``. libc's ``rand()`` is seeded
before the replay ROUTER is created (``unpredictable_routing_ids``), so that no client can take
the routing id libzmq gives the next anonymous client, which would abort the process.
"""

from __future__ import annotations

from typing import NamedTuple

import zmq

from schedkit.core.component import ArgumentError
from schedkit.endpoints import check_endpoint, unpredictable_routing_ids
from schedkit.kv_events.config import KvEventsConfig, bind_or_connect, offset_endpoint
from schedkit.kv_events.replay import ReplayServer, replay_send_hwm

__all__ = ["PublisherSockets", "check_publisher_endpoints", "open_publisher_sockets"]


class PublisherSockets(NamedTuple):
    """What ``open_publisher_sockets`` opened: the PUB socket, its endpoint, the replay server."""

    pub: zmq.Socket
    endpoint: str
    replay: ReplayServer | None


def check_publisher_endpoints(config: KvEventsConfig, dp_rank: int = 0) -> None:
    """Refuse endpoints the publisher could not open, opening nothing: ``ArgumentError``
    names the config key."""
    for key, endpoint, mode in (
        ("endpoint", config.endpoint, config.mode),
        ("replay_endpoint", config.replay_endpoint, "bind"),
    ):
        if endpoint is None:
            continue
        try:
            check_endpoint(
                offset_endpoint(endpoint, dp_rank),
                bind=mode == "bind",
                allow_remote=config.allow_remote,
            )
        except ValueError as exc:
            raise ArgumentError(key, str(exc)) from None


def open_publisher_sockets(
    config: KvEventsConfig,
    dp_rank: int,
    context: zmq.Context,
    *,
    own_context: bool,
    topic: bytes,
    epoch: bytes,
) -> PublisherSockets:
    """Open the PUB socket in ``context`` and, with ``config.replay_endpoint``, the replay
    ROUTER and its (not yet started) server; if one fails, close what was opened, terminate
    ``context`` when the publisher owns it (``own_context``), and raise."""
    pub = router = None
    try:
        pub = context.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, config.hwm)
        endpoint = _open(pub, config.endpoint, config.mode, config, dp_rank)
        replay = None
        if config.replay_endpoint is not None:
            unpredictable_routing_ids()  # before the ROUTER draws its first peer id
            # The replay ROUTER closes with linger 0 and may hold a whole replay queued
            # for clients that left; it lives in the process-wide context, which is never
            # terminated, because libzmq's zmq_ctx_term can hang on such a socket even
            # after it closed (seen once in several runs of the test suite).
            router = (zmq.Context.instance() if own_context else context).socket(zmq.ROUTER)
            router.setsockopt(zmq.SNDHWM, replay_send_hwm(config.buffer_steps))
            replay_endpoint = _open(router, config.replay_endpoint, "bind", config, dp_rank)
            replay = ReplayServer(
                router,
                replay_endpoint,
                topic,
                config.buffer_steps,
                epoch=epoch,
                max_requests=config.max_replay_requests,
            )
    except BaseException:
        for sock in (pub, router):
            if sock is not None:
                sock.close(linger=0)
        if own_context:
            context.term()
        raise
    return PublisherSockets(pub, endpoint, replay)


def _open(sock: zmq.Socket, endpoint: str, mode: str, config: KvEventsConfig, dp_rank: int) -> str:
    return bind_or_connect(
        sock,
        offset_endpoint(endpoint, dp_rank),
        mode,
        allow_remote=config.allow_remote,
    )
