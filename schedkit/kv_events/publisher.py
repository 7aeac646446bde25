"""KV-event publishers: the config, a ZeroMQ PUB publisher with a replay ROUTER, a null
publisher, and a registry of publisher factories by name.

``ZmqEventPublisher.publish`` only appends to a bounded queue; a sender thread encodes each
batch under the configured profile, sends it as ``[topic, seq, payload]`` and keeps the last
``buffer_steps`` payloads, which a replay thread serves to clients that missed some.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Protocol

import msgspec
import structlog
import zmq

from schedkit.kv_events.structs import PROFILES, EventBatch, get_profile

__all__ = [
    "EventPublisher",
    "KvEventsConfig",
    "NullEventPublisher",
    "ZmqEventPublisher",
    "create_publisher",
    "offset_endpoint",
    "parse_kv_events_config",
    "register_publisher",
]

log = structlog.get_logger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_REPLAY_SLICE = 256  # replay frames sent to one client before serving the next
_REPLAY_RETRY_MS = 2  # wait when every replay client's queue is full
_REPLAY_CLIENT_TIMEOUT = 30.0  # seconds a replay client may read nothing before we give up


class KvEventsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where and how KV-cache events are published (the ``kv_events_config`` JSON)."""

    publisher: str = "zmq"
    endpoint: str = "tcp://127.0.0.1:5557"
    replay_endpoint: str | None = None
    buffer_steps: Annotated[int, msgspec.Meta(ge=0)] = 10000
    hwm: Annotated[int, msgspec.Meta(ge=0)] = 100000
    max_queue_size: Annotated[int, msgspec.Meta(ge=1)] = 100000
    topic: str = ""
    profile: Literal["sglang", "vllm"] = "sglang"
    mode: Literal["bind", "connect"] = "bind"


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


class EventPublisher(Protocol):
    """What the scheduler needs from a publisher."""

    published: int
    dropped: int
    encode_errors: int

    def publish(self, batch: EventBatch) -> bool: ...
    def flush(self, timeout: float = 5.0) -> bool: ...
    def shutdown(self, timeout: float = 5.0) -> None: ...
    @property
    def queue_depth(self) -> int: ...


class NullEventPublisher:
    """A publisher that sends nothing; it only counts the batches it is given."""

    def __init__(self, config: KvEventsConfig | None = None, dp_rank: int = 0) -> None:
        self.config = config
        self.dp_rank = dp_rank
        self.published = 0
        self.dropped = 0
        self.encode_errors = 0
        self._closed = False

    @property
    def queue_depth(self) -> int:
        """Always 0: nothing is queued."""
        return 0

    def publish(self, batch: EventBatch) -> bool:
        """Count the batch; False (and a drop) after shutdown."""
        if self._closed:
            self.dropped += 1
            return False
        self.published += 1
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Nothing to wait for."""
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        """Refuse further batches."""
        self._closed = True


class ZmqEventPublisher:
    """Publishes event batches on a ZeroMQ PUB socket, with an optional replay ROUTER.

    ``publish`` never blocks: it takes the next seq and appends to a queue of at most
    ``max_queue_size`` batches (a full queue drops the batch, the seq stays used). A sender
    thread owns the PUB socket: it encodes, sends and buffers batches. A replay thread owns
    the ROUTER and serves replays in turns, so neither the live stream nor other replay
    clients wait for a slow reader. With ``start=False`` the threads wait for ``start()``;
    until then ``flush()`` sends on the caller's thread.
    """

    __slots__ = (
        "_closed",
        "_context",
        "_encode",
        "_idle",
        "_linger_ms",
        "_max_queue_size",
        "_next_seq",
        "_own_context",
        "_pub",
        "_queue",
        "_replay_thread",
        "_ring",
        "_ring_lock",
        "_router",
        "_sender",
        "_shutdown_lock",
        "_stop_r",
        "_stop_w",
        "_stopping",
        "_topic",
        "_wakeup",
        "config",
        "dp_rank",
        "dropped",
        "encode_errors",
        "endpoint",
        "published",
        "replay_endpoint",
    )

    def __init__(
        self,
        config: KvEventsConfig,
        dp_rank: int = 0,
        context: zmq.Context | None = None,
        *,
        start: bool = True,
    ) -> None:
        if dp_rank < 0:
            raise ValueError(f"dp_rank must be >= 0, got {dp_rank}")
        self.config = config
        self.dp_rank = dp_rank
        self.published = 0
        self.dropped = 0
        self.encode_errors = 0
        self._encode = get_profile(config.profile).encode
        self._topic = config.topic.encode()
        self._max_queue_size = config.max_queue_size
        self._queue: deque = deque()
        self._ring: deque = deque(maxlen=config.buffer_steps)
        self._ring_lock = threading.Lock()
        self._next_seq = itertools.count().__next__
        # Held while no wakeup is pending: publish() releases it to wake an idle sender.
        # Unlike a pipe write, a release does not give up the GIL to the woken thread.
        self._wakeup = threading.Lock()
        self._wakeup.acquire()
        self._idle = False
        self._closed = False
        self._stopping = False
        self._linger_ms = 0
        self._sender: threading.Thread | None = None
        self._replay_thread: threading.Thread | None = None
        self._shutdown_lock = threading.Lock()
        self._own_context = context is None
        self._context = zmq.Context() if context is None else context
        self._pub = self._router = None
        try:
            self._pub = self._context.socket(zmq.PUB)
            self._pub.setsockopt(zmq.SNDHWM, config.hwm)
            self.endpoint = self._open(self._pub, config.endpoint, config.mode)
            self.replay_endpoint = None
            if config.replay_endpoint is not None:
                self._router = self._context.socket(zmq.ROUTER)
                # A full client queue then raises EAGAIN (retried) instead of dropping frames.
                self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
                self.replay_endpoint = self._open(self._router, config.replay_endpoint, "bind")
        except BaseException:
            for sock in (self._pub, self._router):
                if sock is not None:
                    sock.close(linger=0)
            if self._own_context:
                self._context.term()
            raise
        self._stop_r, self._stop_w = socket.socketpair()
        log.info(
            "kv_events.publisher_ready",
            endpoint=self.endpoint,
            replay_endpoint=self.replay_endpoint,
            mode=config.mode,
            profile=config.profile,
            dp_rank=dp_rank,
        )
        if start:
            self.start()

    def _open(self, sock: zmq.Socket, endpoint: str, mode: str) -> str:
        endpoint = offset_endpoint(endpoint, self.dp_rank)
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

    @property
    def queue_depth(self) -> int:
        """Batches accepted but not yet handed to the socket."""
        return len(self._queue)

    def publish(self, batch: EventBatch) -> bool:
        """Queue ``batch`` under the next seq; False (counted in ``dropped``) if the queue is
        full or the publisher is shut down."""
        seq = self._next_seq()
        if self._closed or len(self._queue) >= self._max_queue_size:
            self.dropped += 1
            return False
        self._queue.append((seq, batch))
        if self._idle:
            self._idle = False
            self._wake()
        return True

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # not held: a wakeup is already pending
            self._wakeup.release()

    def start(self) -> None:
        """Start the threads (done by the constructor unless ``start=False``)."""
        if self._sender is not None or self._closed:
            return
        self._sender = threading.Thread(target=self._send_loop, name="kv-events-send")
        self._sender.daemon = True
        self._sender.start()
        if self._router is not None:
            self._replay_thread = threading.Thread(
                target=self._replay_loop, name="kv-events-replay"
            )
            self._replay_thread.daemon = True
            self._replay_thread.start()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every batch accepted so far has been handed to the socket."""
        if self._closed:
            return not self._queue
        if self._sender is None:
            self._drain()
            return True
        done = threading.Event()
        self._queue.append((None, done))
        self._wake()
        return done.wait(timeout)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Send everything accepted, then close the sockets (lingering up to ``timeout``
        seconds for queued frames) and stop the threads. Safe to call more than once."""
        with self._shutdown_lock:
            if self._closed:
                return
            self._closed = True
        self._linger_ms = max(0, int(timeout * 1000))
        self._stopping = True
        self._stop_w.send(b"\0")
        if self._sender is None:
            self._drain()
            self._pub.close(linger=self._linger_ms)
            if self._router is not None:
                self._router.close(linger=0)
        else:
            self._wake()
            for thread in (self._sender, self._replay_thread):
                if thread is not None:
                    thread.join(timeout + 1.0)
        if any(t is not None and t.is_alive() for t in (self._sender, self._replay_thread)):
            log.warning("kv_events.shutdown_timeout", endpoint=self.endpoint, timeout=timeout)
        else:
            if self._own_context:
                self._context.term()  # returns once queued frames are out or linger expired
            self._stop_r.close()
            self._stop_w.close()
        # A batch appended by another thread while shutdown began was never sent.
        self.dropped += sum(1 for seq, _ in self._queue if seq is not None)
        self._queue.clear()

    # -- sender thread ----------------------------------------------------------------------

    def _send_loop(self) -> None:
        queue, wakeup = self._queue, self._wakeup
        try:
            while not self._stopping:
                self._drain()
                self._idle = True
                if not queue and not self._stopping:
                    wakeup.acquire()
                self._idle = False
            self._drain()
        except Exception:
            log.exception("kv_events.sender_failed", endpoint=self.endpoint)
        finally:
            self._pub.close(linger=self._linger_ms)

    def _drain(self) -> None:
        queue, send, encode, ring = self._queue, self._pub.send_multipart, self._encode, self._ring
        topic, dp_rank, ring_lock = self._topic, self.dp_rank, self._ring_lock
        while queue:
            seq, batch = queue.popleft()
            if seq is None:  # a flush() marker
                batch.set()
                continue
            try:
                if batch.attn_dp_rank is None:
                    batch.attn_dp_rank = dp_rank
                payload = encode(batch)
            except Exception:
                self.encode_errors += 1
                log.exception("kv_events.encode_failed", seq=seq, endpoint=self.endpoint)
                continue
            seq_bytes = seq.to_bytes(8, "big")
            send((topic, seq_bytes, payload))
            with ring_lock:
                ring.append((seq, seq_bytes, payload))
            self.published += 1

    # -- replay thread ----------------------------------------------------------------------

    def _replay_loop(self) -> None:
        router = self._router
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._stop_r.fileno(), zmq.POLLIN)
        jobs: list[list] = []  # [replies, next index, time of the last progress]
        timeout = None
        try:
            while not self._stopping:
                if router in dict(poller.poll(timeout)):
                    jobs += self._read_replay_requests()
                # Clients are served in turns, one slice each, so a slow one delays nobody.
                progressed = False
                for job in list(jobs):
                    state = self._send_replay_slice(job)
                    if state is None:
                        jobs.remove(job)
                    elif state:
                        progressed = True
                timeout = None if not jobs else 0 if progressed else _REPLAY_RETRY_MS
        except Exception:
            log.exception("kv_events.replay_failed", endpoint=self.replay_endpoint)
        finally:
            router.close(linger=0)

    def _read_replay_requests(self) -> list[list]:
        router, topic, jobs = self._router, self._topic, []
        while True:
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return jobs
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                log.warning(
                    "kv_events.bad_replay_request",
                    frames=[len(f) for f in frames],
                    expected="[identity, b'', start_seq as 8 bytes]",
                )
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            with self._ring_lock:
                buffered = [item for item in self._ring if item[0] >= start]
            replies = [(identity, b"", topic, seq_b, payload) for _, seq_b, payload in buffered]
            replies.append((identity, b"", topic, END_SEQ, b""))
            jobs.append([replies, 0, time.monotonic()])

    def _send_replay_slice(self, job: list) -> bool | None:
        """Send up to one slice of a replay: None once it is finished or abandoned, otherwise
        whether any frame went out."""
        send = self._router.send_multipart
        replies, start = job[0], job[1]
        pos, end = start, min(len(replies), start + _REPLAY_SLICE)
        try:
            while pos < end:
                send(replies[pos], zmq.NOBLOCK)
                pos += 1
        except zmq.Again:  # the client's queue is full: try again later
            pass
        except zmq.ZMQError as exc:  # the client went away (ROUTER_MANDATORY)
            log.warning("kv_events.replay_client_gone", sent=pos, error=exc.strerror)
            return None
        job[1] = pos
        if pos == len(replies):
            return None
        now = time.monotonic()
        if pos > start:
            job[2] = now
            return True
        if now - job[2] > _REPLAY_CLIENT_TIMEOUT:
            log.warning("kv_events.replay_client_stalled", sent=pos, of=len(replies))
            return None
        return False


_FACTORIES: dict[str, Callable[[KvEventsConfig, int], EventPublisher]] = {
    "null": NullEventPublisher,
    "zmq": ZmqEventPublisher,
}


def register_publisher(
    name: str, factory: Callable[[KvEventsConfig, int], EventPublisher], *, replace: bool = False
) -> None:
    """Make ``factory(config, dp_rank)`` the publisher for ``publisher: name`` configs."""
    existing = _FACTORIES.get(name)
    if existing is not None and existing is not factory and not replace:
        raise ValueError(
            f"KV-event publisher {name!r} is already registered ({existing!r}); "
            "pass replace=True to override it"
        )
    _FACTORIES[name] = factory


def create_publisher(config: Any, dp_rank: int = 0) -> EventPublisher:
    """The publisher a config asks for (None or a falsy config gives a NullEventPublisher)."""
    config = parse_kv_events_config(config)
    if config is None:
        return NullEventPublisher(None, dp_rank)
    factory = _FACTORIES.get(config.publisher)
    if factory is None:
        raise ValueError(
            f"unknown KV-event publisher {config.publisher!r}; valid: {', '.join(_FACTORIES)}"
        )
    return factory(config, dp_rank)
