"""The replay side of a KV-event publisher: a ring of the last sent batches (``replay_ring``)
and a ROUTER socket, served from its own thread, that resends them to clients which missed
some.

A client (DEALER) sends ``["", start_seq as 8 bytes big-endian]``; the answer is every buffered
batch with seq >= start as ``["", topic, seq, payload]`` and then the end marker
``["", "", -1 as signed 8 bytes, ""]`` (its topic frame empty, as SGLang and vLLM send it). A
request the server will not serve (its client has ``max_per_client`` replays pending already,
or ``max_requests`` replays are being served) is answered with the end marker alone, as if
nothing were held: vLLM's example subscriber stops reading a replay at the empty payload, ours
at seq -1, so neither mistakes it. A client may also send ``["", b"epoch"]``: the answer is one
end marker whose payload is the publisher's epoch (8 random bytes drawn when the publisher
started), so that a subscriber tells a restarted publisher from a gap whatever the seqs.
Engines' own replay servers answer that request with an empty end marker. Each client's
answers go out in the order of its requests.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections import deque

import structlog
import zmq

from schedkit.endpoints import tcp_address
from schedkit.kv_events.replay_ring import ReplayRing

__all__ = ["END_SEQ", "EPOCH_REQUEST", "MAX_PER_CLIENT", "ReplayServer", "replay_send_hwm"]

log = structlog.get_logger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
EPOCH_REQUEST = b"epoch"
MAX_PER_CLIENT = 2  # replays one client may have pending; more are refused
_REPLAY_SLICE = 256  # frames sent to one client before serving the next
_END = object()  # marks a queued end marker: [_END, payload, how many]


def _wait_until_released(endpoint: str, deadline: float) -> bool:
    """Wait until nothing listens on ``endpoint``'s TCP port (True), or until ``deadline``
    (``time.monotonic()``) passes (False). libzmq closes a socket in its I/O thread after
    ``close()`` returns; the replay ROUTER's context is never terminated, so nothing else
    waits for that. Other transports are not waited on."""
    if not endpoint.startswith("tcp://"):
        return True
    family, host, port = tcp_address(endpoint)
    while True:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as libzmq binds
            try:
                probe.bind((host, int(port)))
                return True
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    return True  # not a port held by a listener: nothing to wait for
                if time.monotonic() >= deadline:
                    return False
        time.sleep(0.002)


def replay_send_hwm(buffer_steps: int) -> int:
    """The SNDHWM to give the replay ROUTER before it binds: a whole replay of the ring and the
    end markers queued behind it fit, so a send blocks only for a client that left more than
    a whole replay unread, never for one that reads, however busy its machine."""
    return max(1000, buffer_steps + 4 * MAX_PER_CLIENT)


class ReplayServer:
    """Keeps the last ``buffer_steps`` batches and serves replays on a bound ROUTER socket.

    ``add`` is called by whoever sends the live stream; ``start`` runs the serving thread,
    which owns the socket from then on; ``stop`` ends it and closes the socket. Clients are
    served in turns, one slice each, so neither a slow reader nor a large replay delays the
    others or ``add``. A client may have ``max_per_client`` replays pending and all clients
    together ``max_requests``; a request over either cap is answered with a bare end marker
    and counted in ``refused``; ``requests`` counts every replay request read, taken or
    refused. A pending replay holds only its client's identity and a
    position in the ring, so a flood of requests costs no memory. A client whose queue is full
    (a send would block: with ``replay_send_hwm`` as the socket's SNDHWM, it left more than a
    whole replay unread) or that went away loses everything pending for it at once, counted
    in ``stalled``, so it holds no place that another client could use. A bad request is
    logged and skipped; nothing a client sends ends the thread.
    """

    __slots__ = (
        "_lock",
        "_pending",
        "_ring",
        "_router",
        "_stop_r",
        "_stop_w",
        "_thread",
        "_topic",
        "endpoint",
        "epoch",
        "max_per_client",
        "max_requests",
        "refused",
        "requests",
        "stalled",
    )

    def __init__(
        self,
        router: zmq.Socket,
        endpoint: str,
        topic: bytes,
        buffer_steps: int,
        *,
        epoch: bytes = b"",
        max_requests: int = 16,
        max_per_client: int = MAX_PER_CLIENT,
    ) -> None:
        self._router = router
        self.endpoint = endpoint
        self.epoch = epoch
        self.max_requests = max_requests
        self.max_per_client = max_per_client
        self.refused = 0
        self.requests = 0
        self.stalled = 0
        self._pending = 0  # replays pending over all clients
        self._topic = topic
        self._ring = ReplayRing(buffer_steps)
        self._lock = threading.Lock()
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        # A full client queue then raises EAGAIN instead of dropping frames unseen.
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)

    def add(self, seq: int, seq_bytes: bytes, payload: bytes) -> None:
        """Buffer one sent batch (the oldest falls out once ``buffer_steps`` are held)."""
        with self._lock:
            self._ring.add((seq, seq_bytes, payload))

    def start(self) -> None:
        """Start serving from a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="kv-events-replay", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop serving, close the socket and wait until its TCP port is free again (so a
        publisher restarted on the same endpoint can bind); False if either took longer
        than ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        if self._thread is None:
            self._router.close(linger=0)
        else:
            self._stop_w.send(b"\0")
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        self._stop_r.close()
        self._stop_w.close()
        return _wait_until_released(self.endpoint, deadline)

    def _loop(self) -> None:
        router = self._router
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._stop_r.fileno(), zmq.POLLIN)
        # Per client, in request order: [start position] for a replay, or
        # [_END, payload, count] for end markers to send once what is before them is out.
        clients: dict[bytes, deque[list]] = {}
        try:
            while True:
                try:
                    ready = dict(poller.poll(0 if clients else None))
                    if self._stop_r.fileno() in ready:
                        return
                    if router in ready:
                        self._read_requests(clients)
                    for identity, queue in list(clients.items()):
                        if not self._serve(identity, queue):
                            self._drop(clients, identity)
                        elif not queue:
                            del clients[identity]
                except zmq.ContextTerminated:
                    return
                except Exception:
                    log.exception("kv_events.replay_error", endpoint=self.endpoint)
                    clients.clear()
                    self._pending = 0
        finally:
            router.close(linger=0)

    def _read_requests(self, clients: dict[bytes, deque[list]]) -> None:
        router = self._router
        for _ in range(1024):  # then serve what is pending before reading more
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            request = frames[2] if len(frames) == 3 and frames[1] == b"" else None
            if request == EPOCH_REQUEST:
                self._answer_end(clients, frames[0], self.epoch)
                continue
            if request is None or len(request) != 8:
                log.warning(
                    "kv_events.bad_replay_request",
                    frames=[len(f) for f in frames[:8]],
                    expected="[identity, b'', start_seq as 8 bytes]",
                )
                continue
            self.requests += 1
            queue = clients.get(frames[0])
            mine = 0 if queue is None else sum(entry[0] is not _END for entry in queue)
            if mine >= self.max_per_client or self._pending >= self.max_requests:
                self.refused += 1
                self._answer_end(clients, frames[0], b"")
                continue
            with self._lock:
                position = self._ring.find(int.from_bytes(request, "big"))
            clients.setdefault(frames[0], deque()).append([position])
            self._pending += 1

    def _answer_end(
        self, clients: dict[bytes, deque[list]], identity: bytes, payload: bytes
    ) -> None:
        """Queue an end marker behind the client's pending answers (merged with an identical
        one queued last, so that a flood of refused requests costs one entry)."""
        queue = clients.setdefault(identity, deque())
        if queue and queue[-1][0] is _END and queue[-1][1] == payload:
            queue[-1][2] += 1
        else:
            queue.append([_END, payload, 1])

    def _serve(self, identity: bytes, queue: deque[list]) -> bool:
        """Send up to one slice of the client's pending answers; False if the client cannot
        take them (its queue is full, or it went away)."""
        send, ring, topic = self._router.send_multipart, self._ring, self._topic
        try:
            for _ in range(_REPLAY_SLICE):
                if not queue:
                    return True
                entry = queue[0]
                if entry[0] is _END:
                    send((identity, b"", b"", END_SEQ, entry[1]), zmq.NOBLOCK)
                    entry[2] -= 1
                    if not entry[2]:
                        queue.popleft()
                    continue
                with self._lock:
                    # A batch that fell out of the ring meanwhile is skipped (a seq gap the
                    # client reports), never sent from a reused slot.
                    position = max(entry[0], ring.first)
                    item = ring.get(position) if position < ring.added else None
                if item is None:
                    send((identity, b"", b"", END_SEQ, b""), zmq.NOBLOCK)
                    queue.popleft()
                    self._pending -= 1
                    continue
                send((identity, b"", topic, item[1], item[2]), zmq.NOBLOCK)
                entry[0] = position + 1
        except zmq.Again:
            log.warning("kv_events.replay_client_stalled", client=identity.hex())
            return False
        except zmq.ZMQError as exc:  # it went away (ROUTER_MANDATORY)
            log.warning("kv_events.replay_client_gone", client=identity.hex(), error=exc.strerror)
            return False
        return True

    def _drop(self, clients: dict[bytes, deque[list]], identity: bytes) -> None:
        queue = clients.pop(identity)
        self._pending -= sum(entry[0] is not _END for entry in queue)
        self.stalled += 1
