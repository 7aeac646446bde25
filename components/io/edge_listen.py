"""The request edge's listening socket (tcp or ipc, non-blocking) and how many descriptors the
process has left for its connections."""

from __future__ import annotations

import os
import resource
import socket

from schedkit.endpoints import tcp_address

__all__ = ["descriptor_headroom", "listen"]


def listen(endpoint: str, backlog: int) -> tuple[socket.socket, str]:
    """A non-blocking listening socket on ``tcp://host:port`` or ``ipc://path``, and the
    endpoint it is bound to (port 0 resolved)."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: object = path
    elif endpoint.startswith("tcp://"):
        family, host, port = tcp_address(endpoint)
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Inherited by accepted connections (Linux): without it Nagle's algorithm holds a
        # small reply until the peer's delayed ACK, ~10-40 ms per request (libzmq sets it).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        address = (host, 0 if port == "*" else int(port))
    else:
        raise ValueError(
            f"zmq_server listens on tcp://HOST:PORT or ipc://PATH, got {endpoint!r} "
            "(it speaks ZMTP on its own sockets; inproc:// belongs to libzmq)"
        )
    try:
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {endpoint!r}: {exc}") from None
    sock.setblocking(False)
    if sock.family == socket.AF_UNIX:
        return sock, endpoint
    host, port = sock.getsockname()[:2]
    return sock, f"tcp://{f'[{host}]' if ':' in host else host}:{port}"


def descriptor_headroom(reserve: int) -> int:
    """How many more descriptors this process may open, keeping ``reserve`` for the rest of
    the process (libzmq's sockets, files, logs)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 64
    return soft - in_use - reserve
