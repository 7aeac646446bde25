"""ZeroMQ endpoints as the project accepts them: tcp, ipc or inproc, and bound on loopback
unless remote listening is asked for; and ``unpredictable_routing_ids``, to call before any
ROUTER socket is created."""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import threading

import structlog

__all__ = ["check_endpoint", "tcp_address", "unpredictable_routing_ids"]

log = structlog.get_logger(__name__)

_seed_lock = threading.Lock()
_seeded = False


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


def tcp_address(endpoint: str) -> tuple[socket.AddressFamily, str, str]:
    """The address family, host (an IPv6 literal without its brackets) and port text of a
    ``tcp://host:port`` endpoint."""
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    host = host.strip("[]")
    return (socket.AF_INET6 if ":" in host else socket.AF_INET), host, port


def _is_loopback(host: str) -> bool:
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def unpredictable_routing_ids() -> None:
    """Seed libc's ``rand()`` from ``os.urandom``, once per process; call it before creating a
    ROUTER socket (later calls do nothing).

    libzmq (4.3) names a ROUTER's anonymous peers ``b"\\0"`` + a 32-bit counter that starts at
    a value drawn from ``rand()``, which nothing seeds: every process's first ROUTER names its
    first anonymous peer ``00 6b 8b 45 67``. A client that takes such a name as its own
    ``ZMQ_ROUTING_ID`` makes libzmq fail an assertion, and abort the process, when the
    anonymous peer meant to get it connects. Seeded, the counter starts where no client can
    guess. Where libc cannot be reached (no ``srand`` symbol) a warning is logged.
    """
    global _seeded
    with _seed_lock:
        if _seeded:
            return
        _seeded = True
        try:
            srand = ctypes.CDLL(None).srand  # the process's libc: the one libzmq calls
        except (OSError, AttributeError, TypeError) as exc:
            log.warning("zmq.routing_ids_predictable", error=str(exc))
            return
        srand.argtypes = [ctypes.c_uint]
        srand(int.from_bytes(os.urandom(4), "little"))
