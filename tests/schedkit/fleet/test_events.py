"""The queue KV-event publisher: wire-encoded batches kept for a consumer in this process."""

from __future__ import annotations

import pytest

from schedkit.fleet.events import QueueEventPublisher, attach
from schedkit.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KvEventsConfig,
    create_publisher,
    decode_batch,
    encode_batch,
)
from schedkit.kv_events.index_decode import decode_for_index


def config(name: str, profile: str = "sglang") -> KvEventsConfig:
    return KvEventsConfig(publisher="queue", endpoint=f"inproc://{name}", profile=profile)


@pytest.mark.parametrize("profile", ["sglang", "vllm"])
def test_batches_come_out_as_the_wire_carries_them(profile):
    publisher = create_publisher(config(f"events-{profile}", profile), dp_rank=2)
    try:
        assert isinstance(publisher, QueueEventPublisher)
        assert publisher.endpoint == f"inproc://events-{profile}_dp2"
        assert attach(publisher.endpoint) is publisher
        first = KVEventBatch(
            ts=1.5,
            events=[BlockStored([11, 12], None, list(range(8)), 4, None, "GPU")],
            attn_dp_rank=2,
        )
        second = KVEventBatch(ts=2.0, events=[BlockRemoved([12], "GPU")], attn_dp_rank=2)
        assert publisher.publish(first) and publisher.publish(second)
        assert (publisher.accepted, publisher.queue_depth, publisher.last_seq) == (2, 2, 1)
        taken = publisher.take()
        assert [seq for seq, _ in taken] == [0, 1]
        assert [decode_batch(payload, profile) for _, payload in taken] == [first, second]
        assert publisher.take() == []
    finally:
        publisher.shutdown()
    for_index = create_publisher(config(f"index-{profile}", profile), dp_rank=2)
    try:
        for_index.keep_for_index()
        third = KVEventBatch(ts=3.0, events=[AllBlocksCleared()], attn_dp_rank=2)
        assert for_index.publish(first) and for_index.publish(second)
        assert for_index.publish(third)
        kept = for_index.take()
        assert [seq for seq, _ in kept] == [0, 1, 2]
        # What the router's index reads off the wire, without the wire.
        wire = [decode_for_index(encode_batch(b, profile)) for b in (first, second, third)]
        assert [view for _, view in kept] == wire
        with pytest.raises(RuntimeError, match="before the first batch"):
            for_index.keep_for_index()
    finally:
        for_index.shutdown()
    with pytest.raises(LookupError, match="no queue KV-event publisher"):
        attach(publisher.endpoint)
    assert not publisher.publish(KVEventBatch(ts=3.0, events=[]))
    assert publisher.dropped == 1


def test_endpoints_must_be_inproc_and_free():
    with pytest.raises(ValueError, match="takes an inproc://name endpoint"):
        QueueEventPublisher(KvEventsConfig(publisher="queue", endpoint="tcp://127.0.0.1:5557"))
    publisher = QueueEventPublisher(config("taken"))
    try:
        with pytest.raises(ValueError, match="already in use"):
            QueueEventPublisher(config("taken"))
    finally:
        publisher.shutdown()
