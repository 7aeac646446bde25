"""KvEventsPublisher on its own: built with keyword arguments, its late-bound stats a lambda,
a real radix cache recording events, and a real ZeroMQ socket receiving its KV metrics."""

import msgspec
import pytest
import zmq

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.io.kv_events_publisher import KvEventsPublisher
from schedkit.components.metrics.reporter import SchedulerStats
from schedkit.kv_events import AllBlocksCleared, BlockStored, page_hashes
from schedkit.kv_events.structs import KvMetrics
from schedkit.testing import CapturingEventPublisher, FakeClock

PAGE = 4


@pytest.fixture
def metrics_socket():
    """A PULL socket on a free loopback port, where the publisher pushes KV metrics."""
    context = zmq.Context()
    sock = context.socket(zmq.PULL)
    sock.bind("tcp://127.0.0.1:0")
    yield sock
    sock.close(linger=0)
    context.term()


def test_cache_events_go_out_as_one_batch_per_call(assembly_leak_check):
    clock = FakeClock(start=100.0)
    cache = RadixCache(
        allocator=TokenToKVPoolAllocator(size=64, page_size=PAGE),
        page_size=PAGE,
        enable_kv_cache_events=True,
    )
    publisher = KvEventsPublisher(
        kv_events_config={"publisher": "capture"},
        tree_cache=cache,
        max_running_requests=8,
        max_total_num_tokens=64,
        page_size=PAGE,
        get_stats=lambda: SchedulerStats(),
        now=clock.now,
    )
    (captured,) = CapturingEventPublisher.instances

    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # two whole pages and one token
    cache.insert(tokens)
    clock.advance(0.5)
    publisher.publish_kv_events()
    publisher.publish_kv_events()  # nothing new: no batch

    (batch,) = captured.batches
    assert (batch.ts, batch.attn_dp_rank) == (100.5, 0)
    first, second = page_hashes(tokens[:8], PAGE)
    assert batch.events[0] == AllBlocksCleared()  # the cache's reset() at construction
    assert (
        batch.events[1:]
        == [  # the new node's whole pages in one event, as SGLang coalesces them
            BlockStored([first, second], None, tokens[:8], PAGE, None, "GPU"),
        ]
    )
    publisher.shutdown()
    assert captured.closed


def test_kv_metrics_are_read_from_the_stats_at_each_emit(metrics_socket, assembly_leak_check):
    stats = SchedulerStats(num_running_reqs=3, num_queue_reqs=2, token_usage=0.25)
    publisher = KvEventsPublisher(
        kv_events_config={"publisher": "capture"},
        tree_cache=RadixCache(capacity=64, page_size=PAGE),
        metrics_endpoint=metrics_socket.getsockopt_string(zmq.LAST_ENDPOINT),
        max_running_requests=8,
        max_total_num_tokens=64,
        page_size=PAGE,
        get_stats=lambda: stats,
    )
    publisher.emit_kv_metrics()
    stats.num_running_reqs, stats.token_usage = 8, 1.0
    publisher.emit_kv_metrics()
    publisher.shutdown()

    decode = msgspec.msgpack.Decoder(KvMetrics).decode
    assert metrics_socket.poll(5000), "no KV metrics arrived"
    first = decode(metrics_socket.recv())
    assert metrics_socket.poll(5000)
    second = decode(metrics_socket.recv())
    # 64 tokens in pages of 4: 16 blocks; a quarter of them in use
    assert (first.kv_total_blocks, first.kv_active_blocks) == (16, 4)
    assert (first.request_active_slots, first.request_total_slots) == (3, 8)
    assert first.num_requests_waiting == 2
    assert (second.request_active_slots, second.kv_active_blocks) == (8, 16)
