"""KvEventsPublisher alone: rank gating, event batches and KV metrics over real loopback ZeroMQ."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq
from structlog.testing import capture_logs

from schedkit import build, load_wiring
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.io.kv_events_publisher import KvEventsPublisher, kv_events_dp_rank
from schedkit.components.metrics.reporter import SchedulerStats
from schedkit.core.parallel_state import ParallelState
from schedkit.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventsConfig,
    KvEventSubscriber,
    page_hashes,
)
from schedkit.kv_events.structs import KvMetrics

LOOPBACK = {"endpoint": "tcp://127.0.0.1:0"}
PROBE = BlockRemoved([-1])


class ListCache:
    """A tree cache stand-in: ``events`` is what the next ``take_events`` returns."""

    def __init__(self, enable_kv_cache_events: bool = True) -> None:
        self.enable_kv_cache_events = enable_kv_cache_events
        self.events: list = []
        self.takes = 0

    def take_events(self) -> list:
        self.takes += 1
        events, self.events = self.events, []
        return events


class Exploding:
    """A parallel state that fails the test if anything reads it."""

    def __getattr__(self, name: str):
        raise AssertionError(f"parallel_state.{name} was read")


def make(cache=None, **kwargs) -> KvEventsPublisher:
    kwargs.setdefault("kv_events_config", LOOPBACK)
    kwargs.setdefault("parallel_state", ParallelState())
    kwargs.setdefault("max_running_requests", 8)
    kwargs.setdefault("max_total_num_tokens", 8192)
    kwargs.setdefault("page_size", 16)
    kwargs.setdefault("get_stats", SchedulerStats)
    return KvEventsPublisher(tree_cache=ListCache() if cache is None else cache, **kwargs)


@pytest.fixture
def closing():
    objects = []
    yield lambda obj: objects.append(obj) or obj
    for obj in reversed(objects):
        obj.shutdown() if hasattr(obj, "shutdown") else obj.close()


def subscribe(pub: KvEventsPublisher) -> KvEventSubscriber:
    """A subscriber that receives ``pub``'s live stream from now on (probes drained)."""
    sub = KvEventSubscriber(pub.endpoint)
    deadline = time.monotonic() + 5
    while True:
        pub.tree_cache.events.append(PROBE)
        pub.publish_kv_events()
        pub.flush()
        if sub.poll(20):
            break
        assert time.monotonic() < deadline, "the subscription never went live"
    while sub.poll(50):
        pass
    return sub


def receive(sub: KvEventSubscriber, n: int) -> list:
    got, deadline = [], time.monotonic() + 5
    while len(got) < n:
        assert time.monotonic() < deadline, f"received {len(got)} of {n} batches"
        got += [b for _, b in sub.poll(20) if b.events != [PROBE]]
    return got


def stored(i: int) -> BlockStored:
    return BlockStored([i], None, [i] * 16, 16, None, "GPU")


@pytest.mark.parametrize("config", [None, ""])
def test_a_missing_config_disables_before_any_rank_is_read(config):
    cache = ListCache()
    pub = make(cache, kv_events_config=config, parallel_state=Exploding(), get_stats=Exploding)
    cache.events.append(stored(1))
    assert not pub.has_pending_events()  # nothing would be published: dropped
    assert cache.events == [] and cache.takes == 1
    cache.events.append(stored(1))
    pub.publish_kv_events()
    pub.emit_kv_metrics()
    pub.shutdown()
    pub.shutdown()
    assert not pub.enabled and pub.endpoint is None
    assert (pub.published, pub.dropped) == (0, 0)
    # The wiring left the cache recording: its events are dropped so they cannot pile up.
    assert cache.events == [] and cache.takes == 2


def test_disabled_rank_leaves_a_non_recording_cache_alone():
    cache = ListCache(enable_kv_cache_events=False)
    pub = make(cache, parallel_state=ParallelState(tp_rank=1, tp_size=2))
    cache.events.append(stored(1))
    pub.publish_kv_events()
    assert not pub.enabled and cache.takes == 0 and cache.events == [stored(1)]


def test_a_recording_cache_on_a_disabled_rank_is_reported():
    with capture_logs() as logs:
        make(ListCache(), kv_events_config=None)
    assert [entry["event"] for entry in logs] == ["kv_events.cache_records_unpublished_events"]


def test_publishes_one_batch_of_pending_events_with_time_and_rank(closing):
    cache = ListCache()
    pub = closing(make(cache, now=lambda: 42.5))
    sub = closing(subscribe(pub))
    published = pub.published

    assert not pub.has_pending_events()
    cache.events += [AllBlocksCleared(), stored(1)]
    assert pub.has_pending_events()  # kept for the next batch, in order
    cache.events += [stored(2), BlockRemoved([1])]
    assert pub.has_pending_events()
    pub.publish_kv_events()
    assert not pub.has_pending_events()
    pub.publish_kv_events()  # nothing pending: no batch
    cache.events.append(stored(3))
    pub.publish_kv_events()
    got = receive(sub, 2)

    assert [b.events for b in got] == [
        [AllBlocksCleared(), stored(1), stored(2), BlockRemoved([1])],
        [stored(3)],
    ]
    assert [(b.ts, b.attn_dp_rank) for b in got] == [(42.5, 0), (42.5, 0)]
    pub.flush()
    assert pub.published == published + 2 and pub.dropped == 0


@pytest.mark.parametrize(
    ("state", "rank"),
    [
        (ParallelState(dp_size=2, dp_rank=1), 1),
        (ParallelState(tp_rank=4, tp_size=8, dp_size=2, enable_dp_attention=True), 1),
        (ParallelState(tp_rank=4, tp_size=8, dp_size=2, dp_rank=0, enable_dp_attention=True), 1),
    ],
)
def test_dp_rank_offsets_the_endpoint_and_stamps_batches(tmp_path, closing, state, rank):
    config = {"endpoint": f"ipc://{tmp_path}/kv"}
    pub = closing(make(kv_events_config=config, parallel_state=state))
    assert pub.enabled and pub.dp_rank == rank == kv_events_dp_rank(state)
    assert pub.endpoint == f"ipc://{tmp_path}/kv_dp{rank}"
    sub = closing(subscribe(pub))
    pub.tree_cache.events.append(stored(7))
    pub.publish_kv_events()
    assert receive(sub, 1)[0].attn_dp_rank == rank


LAYOUTS = {
    "tp4_cp2": [ParallelState(tp_rank=r, tp_size=4, cp_size=2) for r in range(4)],
    "dp_attention_tp8_dp2_cp2": [
        ParallelState(tp_rank=r, tp_size=8, dp_size=2, cp_size=2, enable_dp_attention=True)
        for r in range(8)
    ],
    "dp2_tp2_pp2": [
        ParallelState(tp_rank=t, tp_size=2, pp_rank=p, pp_size=2, dp_size=2, dp_rank=d)
        for d in range(2)
        for p in range(2)
        for t in range(2)
    ],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_exactly_one_publisher_per_dp_rank_and_silent_caches_elsewhere(tmp_path, layout):
    states = LAYOUTS[layout]
    dp_ranks = {kv_events_dp_rank(s) for s in states}
    config = {"endpoint": f"ipc://{tmp_path}/kv"}  # a second publisher per rank would collide
    caches = [
        RadixCache(page_size=4, capacity=64, enable_kv_cache_events=s.publishes_kv_events)
        for s in states
    ]
    pubs = [
        make(cache, kv_events_config=config, parallel_state=s)
        for cache, s in zip(caches, states, strict=True)
    ]
    try:
        publishing = [p.dp_rank for p in pubs if p.enabled]
        assert sorted(publishing) == sorted(dp_ranks)
        for cache, pub, s in zip(caches, pubs, states, strict=True):
            assert pub.enabled == (s.attn_tp_rank == 0 and s.attn_cp_rank == 0 and s.pp_rank == 0)
            cache.insert([1, 2, 3, 4, 5, 6, 7, 8])
            events = cache.take_events()
            if pub.enabled:
                assert [type(e) for e in events] == [AllBlocksCleared, BlockStored]
                assert events[1].block_hashes == page_hashes(range(1, 9), 4)
            else:
                assert events == []
    finally:
        for pub in pubs:
            pub.shutdown()


def test_cp_ranks_with_attn_tp_rank_zero_do_not_publish():
    # Ranks 0 and 2 both have attn_tp_rank 0; only the one with attn_cp_rank 0 publishes.
    states = LAYOUTS["tp4_cp2"]
    assert [(s.attn_tp_rank, s.attn_cp_rank) for s in states] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [s.publishes_kv_events for s in states] == [True, False, False, False]


STATS = dict(num_running_reqs=3, num_queue_reqs=5, cache_hit_rate=0.25)


@pytest.mark.parametrize(
    ("tokens", "page_size", "usage", "total", "active"),
    [
        (8192, 16, 0.5, 512, 256),
        (8192, 1, 0.5, 8192, 4096),
        (8192, 16, 0.0, 512, 0),
        (8200, 16, 1.0, 512, 512),
    ],
)
def test_kv_metrics_worked_examples_over_push(closing, tokens, page_size, usage, total, active):
    ctx = zmq.Context.instance()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    try:
        pub = closing(
            make(
                max_total_num_tokens=tokens,
                page_size=page_size,
                metrics_endpoint=f"tcp://127.0.0.1:{port}",
                get_stats=lambda: SchedulerStats(token_usage=usage, **STATS),
                parallel_state=ParallelState(dp_size=4, dp_rank=3),
            )
        )
        pub.emit_kv_metrics()
        assert pull.poll(5000), "no KvMetrics arrived"
        payload = pull.recv()
    finally:
        pull.close()
    # SGLang's KvMetrics is a tagged array struct: the tag, then the fields in order.
    assert msgspec.msgpack.decode(payload) == ["KvMetrics", 3, 8, active, total, 5, usage, 0.25, 3]
    assert msgspec.msgpack.decode(payload, type=KvMetrics) == KvMetrics(
        request_active_slots=3,
        request_total_slots=8,
        kv_active_blocks=active,
        kv_total_blocks=total,
        num_requests_waiting=5,
        gpu_cache_usage_perc=usage,
        gpu_prefix_cache_hit_rate=0.25,
        data_parallel_rank=3,
    )


def test_no_metrics_socket_without_an_endpoint_or_after_shutdown(closing):
    ctx = zmq.Context.instance()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    try:
        endpoint = f"tcp://127.0.0.1:{port}"
        calls = []
        stats = lambda: calls.append(1) or SchedulerStats()  # noqa: E731
        quiet = closing(make(get_stats=stats))
        quiet.emit_kv_metrics()
        off_rank = make(
            metrics_endpoint=endpoint,
            get_stats=stats,
            parallel_state=ParallelState(pp_rank=1, pp_size=2),
        )
        off_rank.emit_kv_metrics()
        pub = make(metrics_endpoint=endpoint, get_stats=stats)
        pub.shutdown()
        pub.emit_kv_metrics()
        assert calls == [] and not pull.poll(100)
    finally:
        pull.close()


def test_shutdown_publishes_what_the_cache_holds_and_delivers_every_batch():
    cache = ListCache()
    pub = make(cache)
    sub = subscribe(pub)
    try:
        for i in range(2000):
            cache.events.append(stored(i))
            pub.publish_kv_events()
        cache.events.append(stored(2000))  # still in the cache at shutdown
        pub.shutdown()
        pub.shutdown()
        got = receive(sub, 2001)
    finally:
        sub.close()
    assert [b.events[0].block_hashes[0] for b in got] == list(range(2001))
    assert pub.dropped == 0
    pub.publish_kv_events()  # after shutdown: refused and counted, never raised
    cache.events.append(stored(0))
    pub.publish_kv_events()
    assert pub.dropped == 1


@pytest.mark.parametrize(
    "config",
    [
        '{"endpoint": "tcp://127.0.0.1:0", "topic": "kv"}',
        {"endpoint": "tcp://127.0.0.1:0", "topic": "kv"},
        KvEventsConfig(endpoint="tcp://127.0.0.1:0", topic="kv"),
    ],
)
def test_config_forms(closing, config):
    pub = closing(make(kv_events_config=config))
    assert pub.kv_events_config == KvEventsConfig(endpoint="tcp://127.0.0.1:0", topic="kv")
    assert pub.enabled and pub.endpoint.startswith("tcp://127.0.0.1:")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kv_events_config": {"endpont": "x"}}, r"unknown KV-events config key\(s\) 'endpont'"),
        ({"page_size": 0}, r"page_size must be an integer >= 1, got 0"),
        ({"max_running_requests": 0}, r"max_running_requests must be an integer >= 1"),
        ({"max_total_num_tokens": -1}, r"max_total_num_tokens must be an integer >= 0"),
        ({"cache": object()}, r"tree_cache must have a take_events\(\) method"),
        ({"metrics_endpoint": "127.0.0.1:5"}, r"metrics_endpoint '127.0.0.1:5' is not a ZeroMQ"),
        ({"metrics_endpoint": "tcp://nohost"}, r"cannot connect the KV metrics socket"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(**kwargs)


WIRING = """\
components:
  parallel_state:
    type: parallel_state
  tree_cache:
    type: radix_cache
    args:
      page_size: 4
      capacity: 64
      enable_kv_cache_events: !ref parallel_state.publishes_kv_events
  metrics_reporter:
    type: metrics_reporter
    args:
      emit_kv_metrics: !call kv_events_publisher.emit_kv_metrics
      publish_kv_events: !call kv_events_publisher.publish_kv_events
  kv_events_publisher:
    type: kv_events_publisher
    args:
      kv_events_config: {endpoint: "tcp://127.0.0.1:0", topic: kv}
      parallel_state: !ref parallel_state
      tree_cache: !ref tree_cache
      max_running_requests: 4
      max_total_num_tokens: 64
      page_size: 4
      get_stats: !late metrics_reporter.stats
"""


def test_built_from_a_wiring_file(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(WIRING)
    with build(load_wiring(path)) as assembly:
        pub = assembly["kv_events_publisher"]
        assert pub.enabled and pub.kv_events_config.topic == "kv"
        assembly["tree_cache"].insert([1, 2, 3, 4])
        assembly["metrics_reporter"].publish_kv_events()
        pub.flush()
        assert pub.published == 1
        assert pub.kv_metrics().kv_total_blocks == 16
