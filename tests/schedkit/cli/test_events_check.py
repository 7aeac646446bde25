"""``schedkit events check`` against real publishers on loopback: a cache's stream under each
profile conforms; the wrong profile, holes and broken page rules do not."""

from __future__ import annotations

import pytest
from schedkit.components.radix_cache import RadixCache, RadixKey

from schedkit.cli import main
from schedkit.kv_events import (
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KvEventsConfig,
    ZmqEventPublisher,
)


def publisher(profile: str = "sglang", **kwargs) -> ZmqEventPublisher:
    # The checker joins late: a heartbeat soon tells it of the history to replay.
    kwargs.setdefault("heartbeat_interval", 0.05)
    config = KvEventsConfig(
        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", profile=profile, **kwargs
    )
    return ZmqEventPublisher(config)


def cache_stream(pub: ZmqEventPublisher) -> None:
    """What a radix cache records: stores, a split, namespaced pages, evictions, a reset."""
    cache = RadixCache(page_size=4, capacity=64, enable_kv_cache_events=True)
    for key in ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], RadixKey([1] * 8, "lora")):
        cache.insert(key)
        pub.publish(KVEventBatch(0.0, cache.take_events()))
    cache.evict(12)
    pub.publish(KVEventBatch(0.0, cache.take_events()))
    cache.insert(list(range(40)))
    cache.reset()
    cache.insert([5] * 16)
    pub.publish(KVEventBatch(0.0, cache.take_events()))
    assert pub.flush()


def check(pub: ZmqEventPublisher, capsys, *extra: str) -> tuple[int, list[str]]:
    args = ["events", "check", pub.endpoint, "--replay", pub.replay_endpoint, "--timeout", "5"]
    code = main([*args, *extra])
    out = capsys.readouterr().out
    return code, [line for line in out.splitlines() if not line.startswith("20")]


@pytest.mark.parametrize("profile", ["sglang", "sglang-array", "vllm"])
def test_a_cache_stream_conforms_under_its_profile(profile, capsys):
    pub = publisher(profile)
    try:
        cache_stream(pub)
        code, lines = check(pub, capsys, "--profile", profile, "--count", "6")
    finally:
        pub.shutdown()
    assert code == 0, lines
    assert lines[0].startswith("conformant: 6 batches")


def test_the_wrong_profile_does_not_conform(capsys):
    pub = publisher("sglang")
    try:
        cache_stream(pub)
        code, lines = check(pub, capsys, "--profile", "vllm", "--count", "6", "--timeout", "2")
    finally:
        pub.shutdown()
    assert code == 1
    assert lines[0].startswith("NOT conformant")
    assert any("do not decode as vllm" in line for line in lines)


def test_broken_page_rules_are_listed(capsys):
    pub = publisher()
    try:
        pub.publish(KVEventBatch(0.0, [BlockStored([1], 99, [1, 2, 3], 4, None)]))
        pub.publish(KVEventBatch(0.0, [BlockRemoved([7])]))
        pub.publish(KVEventBatch(0.0, [BlockStored([2], None, [1] * 4, 4, None)] * 2))
        assert pub.flush()
        code, lines = check(pub, capsys, "--count", "3")
    finally:
        pub.shutdown()
    assert code == 1
    text = "\n".join(lines)
    assert "3 token ids for 1 hashes of block_size 4" in text
    assert "parent 99 of 1 not stored" in text
    assert "removed 7, which is not stored" in text
    assert "2 stored again without being removed" in text


def test_nothing_arriving_is_not_conformant(capsys):
    pub = publisher(heartbeat_interval=0)
    try:
        code, lines = check(pub, capsys, "--timeout", "0.3")
    finally:
        pub.shutdown()
    assert code == 1 and "no batch arrived" in lines[1]


def test_lost_history_is_reported(capsys):
    pub = publisher(buffer_steps=2)
    try:
        for i in range(6):
            pub.publish(KVEventBatch(float(i), []))
        assert pub.flush()
        code, lines = check(pub, capsys, "--count", "3", "--timeout", "3")
    finally:
        pub.shutdown()
    assert code == 1
    assert any("seq 0 onwards lost" in line for line in lines)
