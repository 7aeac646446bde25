"""The default wiring with examples/swa.yaml: a sliding-window cache as the scheduler's
tree_cache, driven through a workload to the end."""

from __future__ import annotations

import random
from pathlib import Path

import schedkit
from schedkit import Req, SamplingParams
from schedkit.components.cache.swa_radix_cache import SWARadixCache
from schedkit.kv_events import KvIndex
from schedkit.sim.driver import drive
from schedkit.testing import cache_page_hashes
from schedkit.testing.doubles import CapturingEventPublisher
from schedkit.workloads.workload import Arrival, StaticWorkload

ROOT = Path(__file__).resolve().parents[1]
# Every published batch is encoded, decoded back and kept, to be replayed by the test, and
# every output message too.
CAPTURE = {
    "components": {
        "kv_events_publisher": {"args": {"kv_events_config": {"publisher": "capture"}}},
        "output_sender": {"type": "inproc_output_collector"},
    }
}
SMALL_POOLS = {
    "components": {
        "allocator": {"args": {"size": 8192}},
        "tree_cache": {"args": {"swa_capacity": 2048}},
    }
}


def workload(n: int, seed: int = 0) -> StaticWorkload:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(10, 32000) for _ in range(300)] for _ in range(4)]
    arrivals = []
    for i in range(n):
        tail = [rng.randrange(10, 32000) for _ in range(rng.randint(1, 200))]
        req = Req(
            rid=f"r{i}",
            origin_input_ids=prefixes[i % 4] + tail,
            sampling_params=SamplingParams(max_new_tokens=rng.randint(1, 40)),
            cache_salt="tenant-b" if i % 5 == 0 else None,
            priority=i % 3,
        )
        arrivals.append(Arrival(time=i * 0.01, req=req))
    return StaticWorkload(arrivals)


def test_swa_cache_runs_the_default_wiring_and_its_events_replay_to_its_contents():
    wiring = schedkit.load_wiring(
        ROOT / "wiring.yaml", ROOT / "examples" / "swa.yaml", CAPTURE, SMALL_POOLS
    )
    with schedkit.build(wiring) as assembly:
        cache = assembly["tree_cache"]
        assert isinstance(cache, SWARadixCache)
        work = workload(120)
        reqs = [arrival.req for arrival in work.arrivals]
        summary = drive(assembly, work)

        assert summary.requests_done == 120 and summary.requests_failed == 0
        collector = assembly["output_sender"]
        assert collector.double_finishes == []
        for arrival in work.arrivals:
            req = arrival.req
            assert collector.send_counts[req.rid] == 1
            assert len(req.output_ids) == req.sampling_params.max_new_tokens
        assert sum(r.cached_tokens for r in reqs) > 0
        # Every slot is back with its pool or held by the cache, and no lock is left behind.
        assert cache.protected_size() == 0 and cache.swa_protected_size() == 0
        full, swa = assembly["allocator"], cache.swa_allocator
        assert full.available_size() + cache.total_size() == full.size
        assert swa.available_size() + cache.swa_total_size() == swa.size

        assembly["kv_events_publisher"].publish_kv_events()
        (captured,) = CapturingEventPublisher.instances
        assert captured.published > 1
        index = KvIndex()
        for batch in captured.batches:
            index.apply(batch)
        assert index.blocks(0) == cache_page_hashes(cache)
        assert len(cache_page_hashes(cache)) == cache.total_size() // cache.page_size


def test_eagle_bigram_keys_run_the_default_wiring_without_leaking_slots():
    eagle = {
        "components": {
            "tree_cache": {"args": {"is_eagle": True, "enable_kv_cache_events": False}},
            "output_sender": {"type": "inproc_output_collector"},
        }
    }
    wiring = schedkit.load_wiring(
        ROOT / "wiring.yaml", ROOT / "examples" / "swa.yaml", SMALL_POOLS, eagle
    )
    with schedkit.build(wiring) as assembly:
        cache = assembly["tree_cache"]
        assert cache.is_eagle
        work = workload(80, seed=3)
        summary = drive(assembly, work)
        assert summary.requests_done == 80 and summary.requests_failed == 0
        assert sum(a.req.cached_tokens for a in work.arrivals) > 0
        assert cache.protected_size() == 0 and cache.swa_protected_size() == 0
        full, swa = assembly["allocator"], cache.swa_allocator
        assert full.available_size() + cache.total_size() == full.size
        assert swa.available_size() + cache.swa_total_size() == swa.size
        cache.sanity_check()


def test_the_shipped_swa_overlay_keeps_most_of_the_hit_rate():
    """examples/swa.yaml's sliding-window pool holds the default workload's windows: 8,192
    slots gave 10.8% against the radix cache's 72.0% (docs/figures.py swa)."""
    from schedkit import build, load_wiring
    from schedkit.sim.driver import drive
    from schedkit.workloads.workload import synthetic

    events_off = {"components": {"kv_events_publisher": {"args": {"kv_events_config": None}}}}
    wiring = load_wiring(ROOT / "wiring.yaml", ROOT / "examples" / "swa.yaml", events_off)
    with build(wiring) as assembly:
        summary = drive(assembly, synthetic("chat", 400, None, 0))
    assert summary.prefix_cache_hit_rate > 0.5
