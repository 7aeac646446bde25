"""Helpers for the KV-event transport tests: loopback configs, batches, live-subscription waits."""

from __future__ import annotations

import socket
import time

from schedkit.kv_events import BlockStored, KVEventBatch, KvEventsConfig, KvEventSubscriber

LOOPBACK = "tcp://127.0.0.1:0"
PROBE_TS = -1.0


def config(replay: bool = False, **kwargs) -> KvEventsConfig:
    """A config bound to free loopback ports; no heartbeats unless asked for (they take seqs
    that tests counting batches would have to allow for)."""
    kwargs.setdefault("heartbeat_interval", 0)
    if replay:
        kwargs.setdefault("replay_endpoint", LOOPBACK)
    return KvEventsConfig(endpoint=LOOPBACK, **kwargs)


def batch(i: int, tokens: int = 1, rank: int | None = None) -> KVEventBatch:
    """A batch whose content identifies it: ts == i and one page hashed i."""
    token_ids = list(range(i, i + tokens))
    return KVEventBatch(
        ts=float(i),
        events=[BlockStored([i], None, token_ids, tokens, None, "GPU")],
        attn_dp_rank=rank,
    )


def probe() -> KVEventBatch:
    return KVEventBatch(ts=PROBE_TS, events=[])


def wait_live(pub, sub, timeout: float = 5.0) -> list:
    """Publish probes until the subscriber receives something; return what it received."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pub.publish(probe())
        pub.flush()
        got = sub.poll(20)
        if got:
            return got
    raise AssertionError(f"no batch reached the subscriber of {sub.endpoint} in {timeout}s")


def poll_until(sub, done, got: list, timeout: float = 5.0) -> list:
    """Poll into ``got`` until ``done(got)``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done(got):
        if time.monotonic() > deadline:
            seqs = [seq for seq, _ in got]
            raise AssertionError(f"timed out; got {len(got)} batches, last seqs {seqs[-5:]}")
        got += sub.poll(20)
    return got


def seqs(got: list) -> list[int]:
    return [seq for seq, _ in got]


def subscriber_for(pub, **kwargs) -> KvEventSubscriber:
    """A subscriber to ``pub``'s stream and replay socket, under its topic and profile."""
    return KvEventSubscriber(
        pub.endpoint, pub.replay_endpoint, pub.config.topic, pub.config.profile, **kwargs
    )


def wait_released(*endpoints: str, timeout: float = 30.0) -> None:
    """Wait until no socket listens on the tcp ``endpoints`` any more. A publisher's replay
    ROUTER lives in the process-wide context, so ``shutdown()`` returns before libzmq's I/O
    thread has closed its listening socket; a restart on the same port waits for that (a probe
    bound with SO_REUSEADDR, as libzmq binds, succeeds once the listener is gone)."""
    deadline = time.monotonic() + timeout
    for endpoint in endpoints:
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        while True:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((host, int(port)))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"{endpoint} still held after {timeout}s") from None
            time.sleep(0.005)


def wait_connected(endpoint: str, timeout: float = 10.0) -> None:
    """Wait until a TCP connection to the loopback ``endpoint`` is established (as the
    kernel sees it: the connecting socket's I/O thread learns it at once after)."""
    port = int(endpoint.rsplit(":", 1)[1])
    remote = f"0100007F:{port:04X}"
    deadline = time.monotonic() + timeout
    while True:
        with open("/proc/net/tcp") as table:
            rows = [line.split() for line in table.readlines()[1:]]
        if any(row[2] == remote and row[3] == "01" for row in rows):  # 01: ESTABLISHED
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"no connection to {endpoint} after {timeout}s")
        time.sleep(0.005)
