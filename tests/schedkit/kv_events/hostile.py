"""A hostile or broken KV-event publisher, spoken at the socket level: raw live frames, and a
replay socket that answers every request without end."""

from __future__ import annotations

import threading
import time

import msgspec
import zmq

from schedkit.kv_events import BlockStored, KVEventBatch, encode_batch
from schedkit.testing.serving import free_endpoint

_key = msgspec.msgpack.encode


def deep_batch(depth: int = 1000) -> bytes:
    """A batch ``[ts, [BlockStored], 0]`` whose event, a map as SGLang sends it, carries an
    unknown field holding ``depth`` nested arrays (msgspec skips unknown fields by walking
    them)."""
    event = b"\x87" + b"".join(
        _key(k) + _key(v)
        for k, v in (
            ("type", "BlockStored"),
            ("block_hashes", [1]),
            ("parent_block_hash", None),
            ("token_ids", [7, 7, 7, 7]),
            ("block_size", 4),
            ("lora_id", None),
        )
    )
    event += _key("extra") + b"\x91" * depth + b"\xc0"
    return b"\x93" + _key(1.0) + b"\x91" + event + b"\x00"


def page_batch(i: int, pages: int = 1, page: int = 4) -> KVEventBatch:
    """A batch storing ``pages`` pages with hashes from ``i * pages``."""
    hashes = list(range(i * pages, (i + 1) * pages))
    return KVEventBatch(float(i), [BlockStored(hashes, None, [5] * page * pages, page, None)], 0)


class RawPublisher:
    """A publishing socket (an XPUB, which tells when a subscription arrives) that sends
    ``[topic, seq, payload]`` frames as given, and a ROUTER on the replay endpoint that a
    thread answers: each request gets ``payload`` (by default a batch of 64 pages) under seqs
    from 0 up, forever, and never the end marker."""

    def __init__(self, endless_replay: bool = False, payload: bytes | None = None) -> None:
        self.context = zmq.Context()
        self.endpoint, self.replay_endpoint = free_endpoint(), free_endpoint()
        self.pub = self.context.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._subscribed = False
        self.pub.bind(self.endpoint)
        self.replies_sent = 0
        self._stop = threading.Event()
        self._thread = None
        if endless_replay:
            self._payload = payload or encode_batch(page_batch(0, 64))
            router = self.context.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.SNDHWM, 64)
            router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full queue raises, drops nothing
            router.bind(self.replay_endpoint)
            self._thread = threading.Thread(target=self._answer, args=(router,), daemon=True)
            self._thread.start()

    def send(self, seq: int, payload: bytes) -> None:
        """One live frame."""
        self.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    def send_until(self, seq: int, payload: bytes, received, timeout: float = 5.0) -> None:
        """Send the frame once a subscription has reached this socket (what goes out before
        is dropped), then wait until ``received()``. Once only: a frame sent again could
        reach the subscriber twice, and a seq seen twice is a restart to it."""
        deadline = time.monotonic() + timeout
        while not self._subscribed:
            if time.monotonic() > deadline:
                raise AssertionError("no subscription reached the publisher")
            received()  # the subscriber at work meanwhile, as it would be
            if self.pub.poll(0):
                self.pub.recv()
                self._subscribed = True
        self.send(seq, payload)
        while not received():
            if time.monotonic() > deadline:
                raise AssertionError("the subscriber received nothing")

    def _answer(self, router: zmq.Socket) -> None:
        clients: list[list] = []  # [identity, next seq]
        fixed = self._payload
        try:
            while not self._stop.is_set():
                if router.poll(0 if clients else 20):
                    clients.append([router.recv_multipart()[0], 0])
                for client in list(clients):
                    seq = client[1]
                    payload = fixed
                    try:
                        router.send_multipart(
                            [client[0], b"", b"", seq.to_bytes(8, "big"), payload], zmq.NOBLOCK
                        )
                    except zmq.Again:
                        continue
                    except zmq.ZMQError:  # the client left (EHOSTUNREACH)
                        clients.remove(client)
                        continue
                    client[1] += 1
                    self.replies_sent += 1
                if len(clients) > 8:
                    del clients[0]
        finally:
            router.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.pub.close(linger=0)
        self.context.term()
