"""The KV-events config, per-rank endpoints, the publisher interface and the registry that
turns a config into a publisher.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Protocol

import msgspec
import zmq

from schedkit.endpoints import check_endpoint
from schedkit.kv_events.structs import PROFILES, EventBatch, ProfileName

__all__ = [
    "EventPublisher",
    "KvEventsConfig",
    "bind_or_connect",
    "offset_endpoint",
    "parse_kv_events_config",
]


class KvEventsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where and how KV-cache events are published (the ``kv_events_config`` JSON)."""

    publisher: str = "zmq"
    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = None
    buffer_steps: Annotated[int, msgspec.Meta(ge=0)] = 10000
    hwm: Annotated[int, msgspec.Meta(ge=0)] = 100000
    max_queue_size: Annotated[int, msgspec.Meta(ge=1)] = 100000
    topic: str = ""
    profile: ProfileName = "sglang"
    mode: Literal["bind", "connect"] = "bind"
    # Listen on a non-loopback address (tcp binds are refused there otherwise).
    allow_remote: bool = False
    # An empty batch goes out after this many idle seconds, so that a subscriber notices a
    # missed tail while nothing happens (0: never).
    heartbeat_interval: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    # Replays served at once (two at most per client); a request over the cap is answered
    # with a bare end marker at once.
    max_replay_requests: Annotated[int, msgspec.Meta(ge=1)] = 16


_KEYS = KvEventsConfig.__struct_fields__
_CHOICES = {"profile": PROFILES, "mode": ("bind", "connect")}


def parse_kv_events_config(value: Any) -> KvEventsConfig | None:
    """A config from None, a JSON string, a mapping or a config; None means events are off.

    An empty string is treated as None (an unset command-line option).
    """
    if value is None or isinstance(value, KvEventsConfig):
        return value
    if isinstance(value, (str, bytes)):
        if not value.strip():
            return None
        try:
            value = msgspec.json.decode(value)
        except msgspec.DecodeError as exc:
            raise ValueError(f"KV-events config is not valid JSON: {exc}") from None
        if value is None:
            return None
    if not isinstance(value, Mapping):
        raise ValueError(
            f"KV-events config must be a JSON object or a mapping, got {type(value).__name__}"
        )
    unknown = [key for key in value if key not in _KEYS]
    if unknown:
        raise ValueError(
            f"unknown KV-events config key(s) {', '.join(map(repr, unknown))}; "
            f"valid keys: {', '.join(_KEYS)}"
        )
    try:
        return msgspec.convert(dict(value), KvEventsConfig)
    except msgspec.ValidationError as exc:
        message = f"invalid KV-events config: {exc}"
        field = re.search(r"\$\.(\w+)", str(exc))
        key = field.group(1) if field else None
        if key in _CHOICES:
            message += f"; valid values for {key!r}: {', '.join(_CHOICES[key])}"
        raise ValueError(message) from None


def offset_endpoint(endpoint: str, dp_rank: int) -> str:
    """The endpoint of data-parallel rank ``dp_rank``: tcp port + rank, ipc/inproc + ``_dp{rank}``.

    A tcp wildcard port (``0`` or ``*``) is left as is.
    """
    if endpoint.startswith("tcp://"):
        host, sep, port = endpoint.rpartition(":")
        if not sep or host == "tcp":
            raise ValueError(f"tcp endpoint {endpoint!r} has no port, e.g. tcp://127.0.0.1:5557")
        if port in ("0", "*"):
            return endpoint
        if not port.isdigit():
            raise ValueError(f"tcp endpoint {endpoint!r} has a bad port {port!r}")
        return f"{host}:{int(port) + dp_rank}"
    if endpoint.startswith(("ipc://", "inproc://")):
        return f"{endpoint}_dp{dp_rank}"
    raise ValueError(
        f"unsupported KV-events endpoint {endpoint!r}; use tcp://host:port, ipc://path or "
        "inproc://name"
    )


def bind_or_connect(
    sock: zmq.Socket, endpoint: str, mode: str, *, allow_remote: bool = False
) -> str:
    """Bind or connect a publisher's socket to ``endpoint`` (``mode`` "bind" or "connect")
    and return the endpoint it is on (a bound wildcard port resolved).

    The endpoint is checked first: tcp binds only on loopback unless ``allow_remote``
    (``ValueError``); a failed bind or connect raises ``OSError`` naming the endpoint.
    """
    check_endpoint(endpoint, bind=mode == "bind", allow_remote=allow_remote)
    try:
        if mode == "bind":
            sock.bind(endpoint)
            return sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        if mode == "connect":
            sock.connect(endpoint)
            return endpoint
    except zmq.ZMQError as exc:
        raise OSError(
            exc.errno, f"KV-event publisher cannot {mode} to {endpoint}: {exc.strerror}"
        ) from exc
    raise ValueError(f"unknown KV-events mode {mode!r}; valid: bind, connect")


class EventPublisher(Protocol):
    """What the scheduler needs from a publisher."""

    accepted: int
    published: int
    dropped: int
    encode_errors: int

    def publish(self, batch: EventBatch) -> bool: ...
    def flush(self, timeout: float = 5.0) -> bool: ...
    def shutdown(self, timeout: float = 5.0) -> None: ...
    @property
    def queue_depth(self) -> int: ...
