"""The replay side of a KV-event publisher: a ring of the last sent batches and a ROUTER
socket, served from its own thread, that resends them to clients which missed some.

A client (DEALER) sends ``["", start_seq as 8 bytes big-endian]``; the answer is every buffered
batch with seq >= start as ``["", topic, seq, payload]`` and then the end marker
``["", topic, -1 as signed 8 bytes, ""]``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque

import structlog
import zmq

__all__ = ["END_SEQ", "ReplayServer"]

log = structlog.get_logger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_REPLAY_SLICE = 256  # replay frames sent to one client before serving the next
_REPLAY_RETRY_MS = 2  # wait when every replay client's queue is full
_REPLAY_CLIENT_TIMEOUT = 30.0  # seconds a replay client may read nothing before we give up


class ReplayServer:
    """Keeps the last ``buffer_steps`` batches and serves replays on a bound ROUTER socket.

    ``add`` is called by whoever sends the live stream; ``start`` runs the serving thread,
    which owns the socket from then on; ``stop`` ends it and closes the socket. Clients are
    served in turns, one slice each, so a slow reader delays neither the others nor ``add``.
    """

    __slots__ = ("_lock", "_ring", "_router", "_stop_r", "_stop_w", "_thread", "_topic", "endpoint")

    def __init__(self, router: zmq.Socket, endpoint: str, topic: bytes, buffer_steps: int) -> None:
        self._router = router
        self.endpoint = endpoint
        self._topic = topic
        self._ring: deque = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        # A full client queue then raises EAGAIN (retried) instead of dropping frames.
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)

    def add(self, seq: int, seq_bytes: bytes, payload: bytes) -> None:
        """Buffer one sent batch (the oldest falls out once ``buffer_steps`` are held)."""
        with self._lock:
            self._ring.append((seq, seq_bytes, payload))

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
        jobs: list[list] = []  # [replies, next index, time of the last progress]
        timeout = None
        try:
            while True:
                ready = dict(poller.poll(timeout))
                if self._stop_r.fileno() in ready:
                    return
                if router in ready:
                    jobs += self._read_requests()
                progressed = False
                for job in list(jobs):
                    state = self._send_slice(job)
                    if state is None:
                        jobs.remove(job)
                    elif state:
                        progressed = True
                timeout = None if not jobs else 0 if progressed else _REPLAY_RETRY_MS
        except Exception:
            log.exception("kv_events.replay_failed", endpoint=self.endpoint)
        finally:
            router.close(linger=0)

    def _read_requests(self) -> list[list]:
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
            with self._lock:
                buffered = [item for item in self._ring if item[0] >= start]
            replies = [(identity, b"", topic, seq_b, payload) for _, seq_b, payload in buffered]
            replies.append((identity, b"", topic, END_SEQ, b""))
            jobs.append([replies, 0, time.monotonic()])

    def _send_slice(self, job: list) -> bool | None:
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
