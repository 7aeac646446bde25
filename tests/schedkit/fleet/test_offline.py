"""The offline fleet: N assemblies from the default wiring on one virtual timeline, the
router's index fed by the KV events the workers publish."""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import schedkit
from schedkit.assembly.wiring import WiringError
from schedkit.fleet import run_offline
from schedkit.fleet.admission import AdmissionLimits, QueueLimits
from schedkit.fleet.events import QueueEventPublisher
from schedkit.fleet.offline import OfflineFleet, kv_events_config, worker_wiring
from schedkit.fleet.records import request_record
from schedkit.kv_events.structs import get_profile
from schedkit.sim.driver import DECODE_RUN_STEPS, Stepper
from schedkit.testing import cache_page_hashes
from schedkit.workloads.workload import shared_prefix_workload

ROOT = Path(__file__).resolve().parents[3]
WIRING = ROOT / "wiring.yaml"


def workload(seed: int = 0, num_requests: int = 240):
    # 13 prompt families: not a multiple of the worker count, so round robin scatters each
    # family over the workers instead of keeping it on one by accident.
    return shared_prefix_workload(num_requests, groups=13, rate=40.0, seed=seed, stream=True)


def test_kv_routing_beats_round_robin_on_prefix_cache_hits():
    kv = run_offline(WIRING, workload(), 4, "kv")
    rr = run_offline(WIRING, workload(), 4, "round_robin")
    for summary in (kv, rr):
        assert summary.fleet.requests_done == 240
        assert summary.fleet.requests_failed == 0
        assert [w.requests_routed for w in summary.workers] == [
            w.requests_done for w in summary.workers
        ]
        assert sum(w.requests_routed for w in summary.workers) == 240
    assert kv.fleet.prefix_cache_hit_rate > rr.fleet.prefix_cache_hit_rate + 0.04
    assert rr.load_imbalance == 1.0  # 240 requests in turn over 4 workers
    assert kv.load_imbalance < 2.0  # the balance thresholds keep every worker in use
    assert all(w.requests_routed > 0 for w in kv.workers)


def figures(summary) -> dict:
    data = summary.to_dict()
    for part in [*data["workers"], data["fleet"]]:
        del part["wall_s"], part["peak_rss_mib"]
    del data["wall_s"], data["setup_wall_s"]
    return data


def published_on_the_wire(monkeypatch) -> list[tuple[str, bytes]]:
    """Each batch the workers' queue publishers take from now on, as (the rank's endpoint
    suffix, the batch encoded as the ZeroMQ publisher puts it on the wire)."""
    wire: list[tuple[str, bytes]] = []
    publish = QueueEventPublisher.publish

    def recording(self, batch):
        wire.append((self.endpoint.rsplit("_", 1)[1], get_profile(self.profile).encode(batch)))
        return publish(self, batch)

    monkeypatch.setattr(QueueEventPublisher, "publish", recording)
    return wire


def test_the_same_seed_gives_the_same_numbers_and_event_bytes(monkeypatch):
    wire = published_on_the_wire(monkeypatch)
    summary = run_offline(WIRING, workload(seed=3), 3, "kv")
    first, first_wire = figures(summary), wire[:]
    wire.clear()
    assert first == figures(run_offline(WIRING, workload(seed=3), 3, "kv"))
    assert wire == first_wire and len(wire) > 100
    # A batch is dated on its worker's virtual clock (seconds from the start), when the step
    # that made it ended; the two runs took different wall-clock times.
    stamps: dict[str, list[float]] = {}
    for rank, payload in first_wire:
        stamps.setdefault(rank, []).append(msgspec.msgpack.decode(payload)[0])
    assert sorted(stamps) == ["dp0", "dp1", "dp2"]
    for ts in stamps.values():
        assert ts == sorted(ts) and ts[0] > 0 and ts[-1] <= summary.simulated_seconds
    wire.clear()
    assert first != figures(run_offline(WIRING, workload(seed=4), 3, "kv"))
    assert wire != first_wire


@pytest.mark.parametrize("policy", ["least_loaded", "round_robin"])
def test_load_only_policies_spread_the_requests(policy):
    summary = run_offline(WIRING, workload(num_requests=80), 4, policy)
    assert summary.fleet.requests_done == 80
    assert summary.load_imbalance <= 1.25


def test_the_router_index_holds_what_each_worker_cache_holds():
    wirings = [
        worker_wiring(
            WIRING,
            [],
            rank,
            3,
            {
                "publisher": "queue",
                "endpoint": "inproc://fleet-index-test",
                "replay_endpoint": None,
            },
        )
        for rank in range(3)
    ]
    with contextlib.ExitStack() as stack:
        assemblies = [stack.enter_context(schedkit.build(w)) for w in wirings]
        fleet = OfflineFleet(
            assemblies, workload(num_requests=60), "kv", kv_events_config(wirings[0])
        )
        summary = fleet.run()
        for assembly in assemblies:  # what the caches still hold at the end goes out too
            assembly["kv_events_publisher"].publish_kv_events()
        for rank in range(3):
            fleet._take_events(rank)
            held = cache_page_hashes(assemblies[rank]["tree_cache"])
            assert held
            assert fleet.router.index.blocks(rank) == held
            # The index holds at most the worker's pool: 65,536 tokens in 16-token pages.
            assert fleet.router.index.capacity(rank) == 4096
            assert assemblies[rank]["kv_events_publisher"].dp_rank == rank
    assert summary.fleet.requests_done == 60


def test_prefix_routing_needs_kv_events():
    quiet = {"components": {"kv_events_publisher": {"args": {"kv_events_config": None}}}}
    with pytest.raises(WiringError, match="routing by prefix needs the workers' KV events"):
        run_offline(WIRING, workload(num_requests=10), 2, "kv", overlays=[quiet])
    summary = run_offline(WIRING, workload(num_requests=10), 2, "round_robin", overlays=[quiet])
    assert summary.fleet.requests_done == 10


def test_bad_arguments_are_refused_before_building():
    with pytest.raises(ValueError, match="at least one worker"):
        run_offline(WIRING, workload(), 0)
    with pytest.raises(ValueError, match="unknown routing policy 'nope'"):
        run_offline(WIRING, workload(), 2, "nope")


def conversation_trace(path: Path, num_requests: int, seed: int = 0, block: int = 512) -> Path:
    """A conversation-shaped Mooncake trace: every request starts with one hot shared block,
    40% continue an earlier conversation (its blocks, then new ones), inputs log-normal with
    a mean of ~26k tokens, all arriving in one burst."""
    rng = random.Random(seed)
    next_id = itertools.count(1)
    conversations: list[list[int]] = []
    with open(path, "w", encoding="utf-8") as out:
        for _ in range(num_requests):
            if conversations and rng.random() < 0.4:
                earlier = rng.choice(conversations)
                length = min(65536, len(earlier) * block + rng.randint(200, 2000))
                blocks = -(-length // block)
                hashes = earlier[:blocks] + [next(next_id) for _ in range(blocks - len(earlier))]
            else:
                length = min(65536, max(600, int(rng.lognormvariate(9.95, 0.6))))
                hashes = [0] + [next(next_id) for _ in range(-(-length // block) - 1)]
            conversations.append(hashes)
            line = {"timestamp": 0, "input_length": length, "output_length": 100}
            out.write(json.dumps({**line, "hash_ids": hashes}) + "\n")
    return path


def test_one_worker_holding_thousands_of_long_prompts_stays_small_and_counts_refusals(tmp_path):
    """2,500 requests of ~26k prompt tokens each wait on one worker (64 M tokens: 256 MB
    packed, twice that as lists); 500 more are refused at its door and the rest time out."""
    trace = conversation_trace(tmp_path / "conversation.jsonl", 3000)
    command = [
        *("fleet", str(WIRING), "--offline", "--workers", "1", "--workload", str(trace)),
        *("--format", "mooncake", "--worker-max-requests", "2500", "--timeout", "10", "--json"),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "schedkit.cli", *command],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr  # some prompts can never fit: failed
    data = json.loads(done.stdout)
    worker, fleet = data["workers"][0], data["fleet"]
    assert worker["peak_held_requests"] == 2500
    assert worker["requests_routed"] == 3000
    assert worker["requests_refused"] == 500 and fleet["requests_refused"] == 500
    assert fleet["requests_timed_out"] > 2000
    assert fleet["ttft_p99_s"] < 11  # refusals and timeouts are not latencies
    print(f"one worker holding 2,500 waiting prompts: peak RSS {fleet['peak_rss_mib']:.0f} MiB")
    assert fleet["peak_rss_mib"] < 500, fleet["peak_rss_mib"]


EOS = {"components": {"model_runner": {"args": {"eos_token_id": 7, "eos_probability": 0.02}}}}


@pytest.mark.parametrize(
    ("make_workload", "overlays", "admission"),
    [
        # each request streams every token; no follow-ups: workers run ahead between arrivals
        (lambda: workload(seed=5, num_requests=30), (), None),
        # none streams, EOS ends some early, a router queue: the worker furthest behind steps
        (
            lambda: shared_prefix_workload(30, groups=7, rate=30.0, seed=2, stream=False),
            (EOS,),
            AdmissionLimits(worker=QueueLimits(max_requests=2), router=QueueLimits(), timeout=5),
        ),
    ],
    ids=["streaming", "eos-queued"],
)
def test_decode_runs_give_the_numbers_of_step_by_step(
    make_workload, overlays, admission, monkeypatch
):
    results, runs = {}, []
    run_decode = Stepper.run_decode

    def counted(self, until, max_steps=DECODE_RUN_STEPS):
        run = run_decode(self, until, max_steps)
        runs.append(run is not None and len(run[0]))
        return run

    monkeypatch.setattr(Stepper, "run_decode", counted)
    for decode_runs in (True, False):
        records: list[dict] = []
        summary = run_offline(
            WIRING,
            make_workload(),
            3,
            "kv",
            overlays=overlays,
            admission=admission,
            decode_runs=decode_runs,
            record=lambda req, worker, outcome, start, records=records: records.append(
                request_record(req, worker, outcome, start)
            ),
        )
        results[decode_runs] = (figures(summary), records)
        if decode_runs:
            tried = len(runs)
            assert sum(runs) > runs.count(False)  # more steps ran in runs than alone
    assert len(runs) == tried  # step by step tries none
    assert results[True] == results[False]
