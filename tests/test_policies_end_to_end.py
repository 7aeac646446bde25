"""Every scheduling policy selected from YAML (the default wiring plus its overlay in
examples/policies/) runs a workload with priorities and routing keys to the end."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import schedkit
from schedkit import Req, SamplingParams
from schedkit.components import COMPONENT_MODULES
from schedkit.core.component import component_name
from schedkit.sim.driver import drive
from schedkit.workloads.workload import Arrival, StaticWorkload

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = sorted((ROOT / "examples" / "policies").glob("*.yaml"))
SMALL = {
    "components": {
        "allocator": {"args": {"size": 4096}},
        "output_sender": {"type": "inproc_output_collector"},
        "kv_events_publisher": {"args": {"kv_events_config": {"publisher": "null"}}},
    }
}


def workload(n: int) -> StaticWorkload:
    rng = random.Random(1)
    prefixes = [[rng.randrange(10, 32000) for _ in range(64)] for _ in range(3)]
    arrivals = []
    for i in range(n):
        tail = [rng.randrange(10, 32000) for _ in range(rng.randint(1, 64))]
        req = Req(
            rid=f"r{i}",
            origin_input_ids=prefixes[i % 3] + tail,
            sampling_params=SamplingParams(max_new_tokens=rng.randint(1, 60)),
            priority=i % 3,
            routing_key=f"conv{i % 4}",
        )
        arrivals.append(Arrival(time=i * 0.002, req=req))
    return StaticWorkload(arrivals)


def test_every_sglang_policy_has_an_overlay():
    names = {p.stem for p in OVERLAYS}
    sglang = {"lpm", "fcfs", "lof", "random", "routing-key", "dfs-weight", "hrrn"}
    assert sglang | {"priority", "shortest-prefill-first"} <= names
    assert names <= set(COMPONENT_MODULES)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.stem)
def test_policy_from_yaml_runs_a_workload_to_the_end(overlay):
    wiring = schedkit.load_wiring(ROOT / "wiring.yaml", overlay, SMALL)
    with schedkit.build(wiring) as assembly:
        policy = assembly["policy"]
        assert component_name(type(policy)) == overlay.stem
        work = workload(80)
        summary = drive(assembly, work)
        assert summary.requests_done == 80 and summary.requests_failed == 0
        for arrival in work.arrivals:
            req = arrival.req
            assert len(req.output_ids) == req.sampling_params.max_new_tokens
        scheduler = assembly["scheduler"]
        if overlay.stem == "hrrn":
            assert policy.processed_tokens() == scheduler.processed_prefill_tokens > 0
        if overlay.stem == "routing-key":
            assert policy.running_batch() is scheduler.running_batch
