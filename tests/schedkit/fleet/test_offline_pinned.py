"""The offline fleet's results pinned on a small Mooncake-shaped trace: every figure of the
summary and every request's record (its worker, TTFT, end-to-end time, cached tokens), so that
work on the replay's speed cannot change a routing decision or a latency. The digests were
taken from the step-by-step replay; a change that moves one is a change of results and must
say why."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest

from schedkit.fleet import run_offline
from schedkit.fleet.admission import AdmissionLimits, QueueLimits
from schedkit.fleet.records import request_record
from schedkit.fleet.replay import ClosedLoop
from schedkit.workloads.shaped import write_mooncake_shaped
from schedkit.workloads.traces import open_trace

ROOT = Path(__file__).resolve().parents[3]
WIRING = ROOT / "wiring.yaml"
BLOCK = 64  # tokens per hash id: prompts of ~1.5k tokens, the trace's shape at an eighth

LIMITS = {
    # requests wait at the router: an end there sends the next one at once
    "router queue": AdmissionLimits(
        worker=QueueLimits(max_requests=2), router=QueueLimits(max_requests=8), timeout=5.0
    ),
    # no router queue: refusals at the workers' doors, timeouts on the workers
    "worker doors": AdmissionLimits(worker=QueueLimits(max_requests=3), timeout=0.2),
}

# policy, admission, closed-loop concurrency -> (digest, requests routed per worker, TTFT p99)
PINNED = {
    ("kv", None, None): ("392423a04b1df8d9", [18, 15, 14, 13], 0.3030043132046),
    ("dynamo", None, None): ("bb2aff976bb91873", [4, 15, 24, 17], 0.2865441072220258),
    ("llm-d", None, None): ("047f701d8cc0ef83", [15, 17, 14, 14], 0.32433765668700004),
    ("power_of_two", None, None): ("785d408b82e40a85", [19, 18, 4, 19], 0.33791927777060005),
    ("kv", "router queue", None): ("de8df0333f98f768", [9, 11, 11, 10], 2.431625180971314),
    ("kv", "worker doors", None): ("7bc8de93ccf8c978", [21, 18, 11, 10], 0.189412299033008),
    ("sglang", None, 6): ("d9ba36a03c8d7ac0", [20, 16, 13, 11], 0.27400585616864365),
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pinned") / "mooncake.jsonl"
    return write_mooncake_shaped(path, 60, seed=5, rate=6.0, block_size=BLOCK)


@pytest.mark.parametrize(("policy", "admission", "concurrency"), list(PINNED))
def test_offline_replay_gives_the_pinned_results(trace, policy, admission, concurrency):
    records: list[dict] = []
    workload = open_trace(trace, "mooncake", block_size=BLOCK)
    if concurrency is not None:
        workload = ClosedLoop(workload, concurrency)
    summary = run_offline(
        WIRING,
        workload,
        4,
        policy,
        admission=LIMITS.get(admission),
        record=lambda req, worker, outcome, start: records.append(
            request_record(req, worker, outcome, start)
        ),
    )
    data = summary.to_dict()
    for part in [*data["workers"], data["fleet"]]:
        del part["wall_s"], part["peak_rss_mib"]
    del data["wall_s"], data["setup_wall_s"]
    digest = hashlib.sha256(msgspec.json.encode([data, records])).hexdigest()[:16]
    routed = [w["requests_routed"] for w in data["workers"]]
    assert len(records) == 60
    assert (digest, routed, data["fleet"]["ttft_p99_s"]) == PINNED[policy, admission, concurrency]
