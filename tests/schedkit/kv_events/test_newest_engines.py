"""schedkit's consumers on loopback sockets, fed what the newest vLLM publishes for a hybrid
model (``newest``): the subscriber delivers it, the router that fleets and examples route
with indexes only the main-attention group's local pages, and a batch of bytes block hashes
is counted and logged with what to do, never raised."""

from __future__ import annotations

import time

import msgspec
import pytest
from structlog.testing import capture_logs

from schedkit.kv_events import BlockStored, KvEventSubscriber, decode_batch
from schedkit.router.kv_router import KvRouter
from tests.schedkit.kv_events.engine_structs import VllmNewestBatch
from tests.schedkit.kv_events.hostile import RawPublisher
from tests.schedkit.kv_events.newest import (
    H1,
    H2,
    H3,
    bytes_hash_payload,
    cleared_payload,
    hybrid_payloads,
    stored,
)


def stream(rank: int = 0) -> list[bytes]:
    """The hybrid stream, a batch of bytes hashes (seq 4) and vLLM's clear (seq 5)."""
    return [*hybrid_payloads(rank), bytes_hash_payload(rank), cleared_payload(rank)]


# Generous: the condition waited on comes as soon as the machine lets it.
DEADLINE = 30.0


def publish(pub: RawPublisher, payloads: list[bytes], received) -> None:
    """Seq 0 until the subscriber has it (a SUB joins late), then the rest once each."""
    pub.send_until(0, payloads[0], received, timeout=DEADLINE)
    for seq, payload in enumerate(payloads[1:], 1):
        pub.send(seq, payload)


@pytest.mark.parametrize("keep_tokens", [True, False])
def test_a_subscriber_delivers_the_newest_vllm_and_counts_bytes_hashes(keep_tokens, closing):
    pub = closing(RawPublisher())
    sub = closing(KvEventSubscriber(pub.endpoint, profile="vllm", keep_tokens=keep_tokens))
    got: list = []
    payloads = stream()
    with capture_logs() as logs:
        publish(pub, payloads, lambda: got.extend(sub.poll(20)) or got)
        deadline = time.monotonic() + DEADLINE
        while got[-1][0] != 5:
            assert time.monotonic() < deadline, got
            got += sub.poll(20)
    assert [seq for seq, _ in got] == [0, 1, 2, 3, 5]
    for seq, batch in got:
        expected = decode_batch(payloads[seq])
        for event in expected.events:
            if type(event) is BlockStored and not keep_tokens:
                event.token_ids = []
        assert batch == expected
    assert sub.decode_errors == 1
    (bad,) = [entry for entry in logs if entry["event"] == "kv_events.bad_input"]
    assert bad["seq"] == 4 and "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1" in bad["error"]


def test_the_router_indexes_the_main_attention_groups_local_pages(closing):
    pubs = [closing(RawPublisher()) for _ in range(2)]
    endpoints = {rank: (pub.endpoint, None) for rank, pub in enumerate(pubs)}
    router = closing(KvRouter(endpoints, 4, profile="vllm"))
    last = 99  # a page stored last: once it is indexed, every batch before it was applied
    for rank, pub in enumerate(pubs):
        closing_store = VllmNewestBatch(6.0, [stored([last], H3, 0, "full_attention")], rank)
        payloads = [*stream(rank)[:-1], msgspec.msgpack.encode(closing_store)]
        applied = lambda rank=rank: router.poll(20) >= 0 and router.index.num_blocks(rank) > 0  # noqa: E731
        publish(pub, payloads, applied)
    router.sync(lambda r: all(r.index.holds(rank, last) for rank in (0, 1)), DEADLINE)
    for rank in (0, 1):
        assert router.index.held(rank) == {H1, H2, H3, last}
        assert router.subscribers[rank].decode_errors == 1  # the bytes hashes
    assert router.untrusted == [] and router.index.violations(1) == 0
