"""The live fleet: worker processes (spawned, ~1 s each to start on a small machine) on
free loopback ports, a router following their KV events, and workers that die."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from schedkit.fleet.live import LiveFleet, WorkerStartError
from schedkit.sim.workload import shared_prefix_workload

WIRING = Path(__file__).resolve().parents[3] / "wiring.yaml"


def workload(num_requests: int, output_len: int = 16, rate: float = 40.0):
    return shared_prefix_workload(
        num_requests, groups=5, output_len=output_len, rate=rate, stream=True
    )


def test_every_request_completes_and_the_router_follows_the_kv_events():
    with LiveFleet(WIRING, 2, "kv") as fleet:
        summary = fleet.run(workload(24))
        index_ranks = fleet.router.index.ranks()
    assert summary.fleet.requests_done == 24
    assert summary.fleet.requests_failed == 0
    assert sum(w.requests_routed for w in summary.workers) == 24
    assert [w.requests_done for w in summary.workers] == [
        w.requests_routed for w in summary.workers
    ]
    assert summary.fleet.output_tokens == 24 * 16
    # Five prompt families over two workers: later requests of a family find its prefix.
    assert summary.fleet.prefix_cache_hit_rate > 0.3
    assert index_ranks  # KV events arrived over the sockets
    for worker in summary.workers:
        assert worker.alive
        assert worker.peak_rss_mb > 0  # reported by the worker process itself
        assert worker.ttft_p50 > 0 and worker.e2e_p99 >= worker.ttft_p99 > 0
    assert fleet.deaths == {}


def test_a_killed_worker_is_noticed_and_the_rest_take_the_load():
    seen = {}

    def kill_worker_1(fleet: LiveFleet, sent: int) -> None:
        if sent == 12:
            seen["routed_to_1"] = fleet.routed[1]
            fleet.kill(1)

    with LiveFleet(WIRING, 3, "round_robin") as fleet:
        summary = fleet.run(workload(36, output_len=64, rate=30.0), on_route=kill_worker_1)
    assert fleet.deaths == {1: "its process exited"}
    dead, *rest = summary.workers[1], summary.workers[0], summary.workers[2]
    assert not dead.alive
    # Nothing went to worker 1 after the router noticed (within a heartbeat of the kill).
    assert dead.requests_routed <= seen["routed_to_1"] + 1
    assert dead.requests_failed > 0  # what it had in flight is reported failed
    assert dead.requests_done + dead.requests_failed == dead.requests_routed
    assert all(w.requests_failed == 0 and w.alive for w in rest)
    assert summary.fleet.requests_done + summary.fleet.requests_failed == 36
    assert summary.fleet.requests_failed == dead.requests_failed


def test_a_silent_worker_is_taken_out_after_the_heartbeat_timeout():
    def stop_worker_0(fleet: LiveFleet, sent: int) -> None:
        if sent == 4:
            os.kill(fleet.handles[0].pid, signal.SIGSTOP)  # alive but answering nothing

    with LiveFleet(WIRING, 2, "least_loaded", heartbeat_timeout=1.0) as fleet:
        summary = fleet.run(workload(16, rate=8.0), on_route=stop_worker_0)
    assert fleet.deaths == {0: "no heartbeat for 1 s"}
    assert summary.fleet.requests_done + summary.fleet.requests_failed == 16
    assert summary.workers[1].requests_done > 0


def test_a_worker_that_cannot_start_is_reported(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("components:\n  scheduler:\n    args:\n      max_running_requests: 0\n")
    with pytest.raises(WorkerStartError, match=r"worker \d: .*max_running_requests"):
        LiveFleet(WIRING, 1, "round_robin", overlays=[bad]).start()


def test_ray_launcher_without_ray_says_how_to_install_it():
    try:
        import ray  # noqa: F401
    except ImportError:
        with pytest.raises(WorkerStartError, match=r"pip install 'schedkit\[ray\]'"):
            LiveFleet(WIRING, 1, "round_robin", launcher="ray").start()
    else:
        pytest.skip("Ray is installed")


def test_ray_launcher_runs_the_same_workers():
    pytest.importorskip("ray")
    with LiveFleet(WIRING, 2, "kv", launcher="ray") as fleet:
        summary = fleet.run(workload(8))
    assert summary.fleet.requests_done == 8
