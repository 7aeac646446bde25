"""The default wiring with examples/hicache.yaml: the host-memory tier as the scheduler's
tree_cache, driven through a workload whose prefixes do not fit the device pool."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import schedkit
from schedkit import Req, SamplingParams
from schedkit.components.cache.hiradix_cache import HiRadixCache
from schedkit.kv_events import KvIndex
from schedkit.sim.driver import drive
from schedkit.testing.doubles import CapturingEventPublisher
from schedkit.workloads.workload import Arrival, StaticWorkload

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = {
    "components": {
        "kv_events_publisher": {"args": {"kv_events_config": {"publisher": "capture"}}},
        "output_sender": {"type": "inproc_output_collector"},
    }
}
SMALL_POOL = {"components": {"allocator": {"args": {"size": 4096}}}}


def workload(n: int, seed: int = 0, gap: float = 0.05) -> StaticWorkload:
    """Requests cycling over 6 prefixes of 1024 tokens: more than the device pool holds, less
    than the host pool (twice the device pool)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(10, 32000) for _ in range(1024)] for _ in range(6)]
    arrivals = []
    for i in range(n):
        tail = [rng.randrange(10, 32000) for _ in range(rng.randint(1, 64))]
        req = Req(
            rid=f"r{i}",
            origin_input_ids=prefixes[i % 6] + tail,
            sampling_params=SamplingParams(max_new_tokens=rng.randint(1, 16)),
        )
        arrivals.append(Arrival(time=i * gap, req=req))
    return StaticWorkload(arrivals)


def page_hashes_held(cache: HiRadixCache) -> tuple[set[int], set[int]]:
    """The published page hashes whose KV is on the device, and those with a host copy."""
    device, host, stack = set(), set(), list(cache.root.children.values())
    while stack:
        node = stack.pop()
        if node.value is not None:
            device.update(node.hashes)
        if node.host_value is not None:
            host.update(node.hashes)
        stack.extend(node.children.values())
    return device, host


def test_host_tier_serves_hits_the_device_pool_lost_and_its_events_replay_per_medium():
    wiring = schedkit.load_wiring(
        ROOT / "wiring.yaml", ROOT / "examples" / "hicache.yaml", CAPTURE, SMALL_POOL
    )
    with schedkit.build(wiring) as assembly:
        cache = assembly["tree_cache"]
        assert isinstance(cache, HiRadixCache)
        work = workload(72)
        reqs = [arrival.req for arrival in work.arrivals]
        summary = drive(assembly, work)

        assert summary.requests_done == 72 and summary.requests_failed == 0
        host_hits = sum(r.cached_tokens_host for r in reqs)
        assert host_hits > 0 and cache.loaded_back_tokens >= host_hits
        assert all(r.cached_tokens == r.cached_tokens_device + r.cached_tokens_host for r in reqs)
        seen = sum(len(r.origin_input_ids) for r in reqs)
        assert summary.prefix_cache_hit_rate_host == host_hits / seen
        assert summary.prefix_cache_hit_rate == (
            summary.prefix_cache_hit_rate_device + summary.prefix_cache_hit_rate_host
        )
        # The output stream reports each request's hits by tier, as SGLang's does.
        reported = {}
        for msg in assembly["output_sender"].messages:
            for rid, reason, details in zip(
                msg.rids, msg.finished_reasons, msg.cached_tokens_details, strict=True
            ):
                if reason is not None:
                    reported[rid] = details
        by_rid = {r.rid: r for r in reqs}
        assert any(d and d["host"] > 0 for d in reported.values())
        for rid, details in reported.items():
            req = by_rid[rid]
            if req.cached_tokens:
                assert details == {
                    "device": req.cached_tokens_device,
                    "host": req.cached_tokens_host,
                }
        assert cache.protected_size() == 0
        cache.sanity_check()
        device_pool = assembly["allocator"]
        assert device_pool.available_size() + cache.total_size() == device_pool.size

        assembly["kv_events_publisher"].publish_kv_events()
        (captured,) = CapturingEventPublisher.instances
        gpu, cpu = KvIndex(medium="GPU"), KvIndex(medium="CPU_PINNED")
        for batch in captured.batches:
            gpu.apply(batch)
            cpu.apply(batch)
        device, host = page_hashes_held(cache)
        assert gpu.blocks(0) == device and cpu.blocks(0) == host
        assert host - device  # some pages live on the host only


def test_load_backs_cost_simulated_time():
    def simulated_seconds(bandwidth: float) -> float:
        slow = {
            "components": {
                "tree_cache": {"args": {"host_bandwidth": bandwidth}},
                "policy": {"type": "fcfs", "args": {"tree_cache": None}},
            }
        }
        wiring = schedkit.load_wiring(
            ROOT / "wiring.yaml", ROOT / "examples" / "hicache.yaml", CAPTURE, SMALL_POOL, slow
        )
        with schedkit.build(wiring) as assembly:
            # All at once and first come first served: the schedule does not depend on the clock.
            work = workload(36, gap=0.0)
            summary = drive(assembly, work)
            loaded = assembly["tree_cache"].loaded_back_tokens
            return summary.simulated_seconds, loaded, summary.ttft_p99

    fast, loaded_fast, _ = simulated_seconds(5.0e10)
    slow, loaded_slow, _ = simulated_seconds(5.0e8)
    assert loaded_fast == loaded_slow > 0
    # Each loaded token costs 131072 B / 5e8 B/s instead of 131072 B / 5e10 B/s.
    extra = loaded_fast * 131072 * (1 / 5.0e8 - 1 / 5.0e10)
    assert slow - fast == pytest.approx(extra)
