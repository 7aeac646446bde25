"""ZeroMQ endpoints as the project accepts them: tcp, ipc or inproc, and bound on loopback
unless remote listening is asked for; and ``seed_router_ids``, which every process that binds a
ROUTER socket calls before creating it."""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import os
from collections.abc import Callable

__all__ = ["check_endpoint", "seed_router_ids"]


def check_endpoint(endpoint: str, *, bind: bool, allow_remote: bool = False) -> str:
    """Validate a ZeroMQ endpoint and return it.

    ``tcp://host:port``, ``ipc://path`` and ``inproc://name`` are accepted. A tcp endpoint that
    is bound must be on a loopback address (127.0.0.0/8 or ``[::1]``) unless ``allow_remote``;
    port ``0`` or ``*`` picks a free port.
    """
    if not isinstance(endpoint, str):
        raise ValueError(f"endpoint must be a string like tcp://127.0.0.1:5555, got {endpoint!r}")
    if endpoint.startswith(("ipc://", "inproc://")):
        return endpoint
    if not endpoint.startswith("tcp://"):
        raise ValueError(
            f"unsupported endpoint {endpoint!r}; use tcp://127.0.0.1:PORT, ipc://PATH or "
            "inproc://NAME"
        )
    host, sep, port = endpoint[len("tcp://") :].rpartition(":")
    if not sep or not host:
        raise ValueError(
            f"tcp endpoint {endpoint!r} needs host and port, e.g. tcp://127.0.0.1:5555"
        )
    if port != "*" and not (port.isdigit() and 0 <= int(port) <= 65535):
        raise ValueError(f"tcp endpoint {endpoint!r} has a bad port {port!r}: use 0-65535 or *")
    if bind and not allow_remote and not _is_loopback(host):
        raise ValueError(
            f"refusing to bind {endpoint!r}: not a loopback address; bind to 127.0.0.1 or "
            "[::1], or set allow_remote: true to listen on other interfaces"
        )
    return endpoint


def _is_loopback(host: str) -> bool:
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def seed_router_ids() -> bool:
    """Seed the C library's ``rand()`` from ``os.urandom``, so that the routing ids libzmq
    gives the anonymous peers of ROUTER sockets created afterwards cannot be predicted; True
    if it was seeded (False where no C library with ``srand`` is found).

    libzmq (4.3) starts each new ROUTER's counter of automatic routing ids (``b"\\x00"`` and a
    32-bit counter) from ``rand()``, which nothing seeds: on glibc the first ROUTER of every
    process hands out ``00 6b 8b 45 67`` first. A peer that sets that value as its own
    ``ROUTING_ID`` makes libzmq abort the whole process (a failed assertion) when the next
    anonymous peer connects and is given the same id. Seeded, the counter starts at one of
    2^32 values that no client sees (``zmq_server`` never sends routing ids), so such a peer must
    guess it: each connection attempt succeeds with a probability of about (anonymous
    connections still to come while it stays connected) / 2^32. It stays a probability:
    libzmq 4.3 checks automatic ids against nothing. Call it right before creating a ROUTER
    (seeding again later changes no existing socket's counter).
    """
    srand = _c_srand()
    if srand is None:
        return False
    srand(int.from_bytes(os.urandom(4), "little"))
    return True


def _c_srand() -> Callable[[int], None] | None:
    for name in (None, ctypes.util.find_library("c")):
        try:
            srand = ctypes.CDLL(name).srand
        except (OSError, AttributeError, TypeError):
            continue
        srand.argtypes = [ctypes.c_uint]
        srand.restype = None
        return srand
    return None
