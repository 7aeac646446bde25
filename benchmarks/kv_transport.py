"""Events per second from a publisher to a decoding consumer in another process, over loopback
tcp: ``ZmqEventPublisher`` into ``KvEventSubscriber``, or the same batches encoded and sent inline
on one PUB socket to a plain SUB that decodes them (the baseline). Used by
``bench_kv_events.py`` (a)."""

from __future__ import annotations

import multiprocessing
import time

import zmq

from schedkit.kv_events import (
    KVEventBatch,
    KvEventsConfig,
    KvEventSubscriber,
    ZmqEventPublisher,
    get_profile,
)

__all__ = ["PROBE_TS", "transport_rate"]

PROBE_TS = -1.0


def consume(mode: str, endpoint: str, expected: int, conn) -> None:
    """Consumer process: decode every batch; report "live" on the first probe, then the
    monotonic time at which the ``expected``-th real batch was decoded."""
    ctx = zmq.Context()
    if mode == "subscriber":
        sub = KvEventSubscriber(endpoint, hwm=0, context=ctx)

        def receive() -> list:
            return [batch for _, batch in sub.poll(100)]

    else:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        decode = get_profile("sglang").decode

        def receive() -> list:
            if not sub.poll(100):
                return []
            out = []
            while True:
                try:
                    _, seq, payload = sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return out
                int.from_bytes(seq, "big")
                out.append(decode(payload))

    live, count = False, 0
    while count < expected:
        for batch in receive():
            if batch.ts == PROBE_TS:
                if not live:
                    live = True
                    conn.send("live")
                continue
            count += 1
    conn.send(time.monotonic())
    sub.close()
    ctx.destroy(linger=0)


def transport_rate(mode: str, batches: list[KVEventBatch]) -> float:
    """Events per second delivered to a decoding consumer in another process."""
    spawn = multiprocessing.get_context("spawn")
    parent, child = spawn.Pipe()
    if mode == "subscriber":
        pub = ZmqEventPublisher(
            KvEventsConfig(
                endpoint="tcp://127.0.0.1:0", hwm=0, max_queue_size=len(batches) + 10_000
            )
        )
        endpoint = pub.endpoint

        def send(batch: KVEventBatch) -> None:
            pub.publish(batch)

    else:
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 0)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
        encode, seqs = get_profile("sglang").encode, iter(range(1 << 62))

        def send(batch: KVEventBatch) -> None:
            pub.send_multipart((b"", next(seqs).to_bytes(8, "big"), encode(batch)))

    proc = spawn.Process(target=consume, args=(mode, endpoint, len(batches), child))
    proc.start()
    try:
        while not parent.poll(0.01):  # wait until the subscription is live
            send(KVEventBatch(PROBE_TS, [], 0))
        parent.recv()
        start = time.monotonic()
        for batch in batches:
            send(batch)
        if not parent.poll(120):
            raise RuntimeError(f"the {mode} consumer did not receive every batch")
        end = parent.recv()
    finally:
        proc.join(10)
        if mode == "subscriber":
            pub.shutdown(timeout=1.0)
        else:
            pub.close(linger=0)
            ctx.term()
    return sum(len(b.events) for b in batches) / (end - start)
