"""The replay side of a KV-event publisher: a ring of the last sent batches and a ROUTER
socket, served from its own thread, that resends them to clients which missed some.

A client (DEALER) sends ``["", start_seq as 8 bytes big-endian]``; the answer is every buffered
batch with seq >= start as ``["", topic, seq, payload]`` and then the end marker
``["", topic, -1 as signed 8 bytes, ""]``. A client may also send ``["", b"epoch"]``: the answer
is one end marker whose payload is the publisher's epoch (8 random bytes drawn when the
publisher started), so that a subscriber tells a restarted publisher from a gap whatever the
seqs. Engines' own replay servers answer that request with an empty end marker.
"""

from __future__ import annotations

import socket
import threading
import time

import structlog
import zmq

__all__ = ["END_SEQ", "EPOCH_REQUEST", "ReplayServer"]

log = structlog.get_logger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
EPOCH_REQUEST = b"epoch"
_REPLAY_SLICE = 256  # replay frames sent to one client before serving the next
_REPLAY_RETRY_MS = 2  # wait when every replay client's queue is full
_REPLAY_CLIENT_TIMEOUT = 30.0  # seconds a replay client may read nothing before we give up


class _Ring:
    """The last ``size`` sent batches, addressed by their position in the sent stream (0 for
    the first batch ever added), so a replay walks it without copying it."""

    __slots__ = ("added", "items", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: list = [None] * size
        self.added = 0

    def add(self, item: tuple) -> None:
        if self.size:
            self.items[self.added % self.size] = item
        self.added += 1

    @property
    def first(self) -> int:
        """The position of the oldest batch still held."""
        return max(0, self.added - self.size)

    def get(self, position: int) -> tuple:
        return self.items[position % self.size]

    def find(self, seq: int) -> int:
        """The position of the first held batch with a seq >= ``seq`` (``added`` if none);
        seqs grow along the stream, so this is a binary search."""
        lo, hi = self.first, self.added
        while lo < hi:
            mid = (lo + hi) // 2
            if self.get(mid)[0] < seq:
                lo = mid + 1
            else:
                hi = mid
        return lo


class ReplayServer:
    """Keeps the last ``buffer_steps`` batches and serves replays on a bound ROUTER socket.

    ``add`` is called by whoever sends the live stream; ``start`` runs the serving thread,
    which owns the socket from then on; ``stop`` ends it and closes the socket. Clients are
    served in turns, one slice each, so a slow reader delays neither the others nor ``add``;
    at most ``max_requests`` replays are served at once (more are refused and counted in
    ``refused``), and each holds only its client's identity and a position in the ring, so a
    flood of requests costs no memory. A bad request is logged and skipped; nothing a client
    sends ends the thread.
    """

    __slots__ = (
        "_lock",
        "_ring",
        "_router",
        "_stop_r",
        "_stop_w",
        "_thread",
        "_topic",
        "endpoint",
        "epoch",
        "max_requests",
        "refused",
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
    ) -> None:
        self._router = router
        self.endpoint = endpoint
        self.epoch = epoch
        self.max_requests = max_requests
        self.refused = 0
        self._topic = topic
        self._ring = _Ring(buffer_steps)
        self._lock = threading.Lock()
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        # A full client queue then raises EAGAIN (retried) instead of dropping frames.
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
        """Stop serving and close the socket; False if the thread did not end in time."""
        if self._thread is None:
            self._router.close(linger=0)
        else:
            self._stop_w.send(b"\0")
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        self._stop_r.close()
        self._stop_w.close()
        return True

    def _loop(self) -> None:
        router = self._router
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._stop_r.fileno(), zmq.POLLIN)
        jobs: list[list] = []  # [identity, next ring position, time of the last progress]
        timeout = None
        try:
            while True:
                try:
                    ready = dict(poller.poll(timeout))
                    if self._stop_r.fileno() in ready:
                        return
                    if router in ready:
                        self._read_requests(jobs)
                    progressed = False
                    for job in list(jobs):
                        state = self._send_slice(job)
                        if state is None:
                            jobs.remove(job)
                        elif state:
                            progressed = True
                    timeout = None if not jobs else 0 if progressed else _REPLAY_RETRY_MS
                except zmq.ContextTerminated:
                    return
                except Exception:
                    log.exception("kv_events.replay_error", endpoint=self.endpoint)
                    jobs.clear()
                    timeout = None
        finally:
            router.close(linger=0)

    def _read_requests(self, jobs: list[list]) -> None:
        router = self._router
        for _ in range(1024):  # then serve what is pending before reading more
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) == 3 and frames[1] == b"" and frames[2] == EPOCH_REQUEST:
                self._send((frames[0], b"", self._topic, END_SEQ, self.epoch))
                continue
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                log.warning(
                    "kv_events.bad_replay_request",
                    frames=[len(f) for f in frames[:8]],
                    expected="[identity, b'', start_seq as 8 bytes]",
                )
                continue
            if len(jobs) >= self.max_requests:
                self.refused += 1
                continue
            with self._lock:
                position = self._ring.find(int.from_bytes(frames[2], "big"))
            jobs.append([frames[0], position, time.monotonic()])

    def _send(self, frames: tuple) -> bool:
        try:
            self._router.send_multipart(frames, zmq.NOBLOCK)
        except zmq.ZMQError:  # the client's queue is full, or it went away
            return False
        return True

    def _send_slice(self, job: list) -> bool | None:
        """Send up to one slice of a replay: None once it is finished or abandoned, otherwise
        whether any frame went out."""
        send, ring, topic = self._router.send_multipart, self._ring, self._topic
        identity, start = job[0], job[1]
        pos = start
        try:
            for _ in range(_REPLAY_SLICE):
                with self._lock:
                    # A batch that fell out of the ring meanwhile is skipped (a seq gap
                    # the client reports), never sent from a reused slot.
                    pos = max(pos, ring.first)
                    if pos >= ring.added:
                        send((identity, b"", topic, END_SEQ, b""), zmq.NOBLOCK)
                        return None
                    _, seq_bytes, payload = ring.get(pos)
                send((identity, b"", topic, seq_bytes, payload), zmq.NOBLOCK)
                pos += 1
        except zmq.Again:  # the client's queue is full: try again later
            pass
        except zmq.ZMQError as exc:  # the client went away (ROUTER_MANDATORY)
            log.warning("kv_events.replay_client_gone", error=exc.strerror)
            return None
        job[1] = pos
        now = time.monotonic()
        if pos > start:
            job[2] = now
            return True
        if now - job[2] > _REPLAY_CLIENT_TIMEOUT:
            log.warning("kv_events.replay_client_stalled", position=pos)
            return None
        return False
