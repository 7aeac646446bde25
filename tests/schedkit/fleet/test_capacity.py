"""``--workers`` beyond what the machine holds is refused up front, live and offline."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from schedkit.fleet import capacity
from schedkit.fleet.capacity import FleetCapacityError, check_live_workers
from schedkit.fleet.live import LiveFleet
from schedkit.fleet.offline import run_offline
from schedkit.workloads.workload import shared_prefix_workload

WIRING = Path(__file__).resolve().parents[3] / "wiring.yaml"


def test_live_workers_are_capped_by_cores_and_memory(monkeypatch):
    cores = capacity.usable_cores()
    check_live_workers(cores * capacity.LIVE_WORKERS_PER_CORE)
    with pytest.raises(FleetCapacityError, match=r"per core.*--no-worker-cap"):
        LiveFleet(WIRING, 10000)
    monkeypatch.setattr(capacity, "available_mib", lambda: 250.0)
    with pytest.raises(FleetCapacityError, match=r"250 MiB are available: at most 2"):
        check_live_workers(3)


def test_offline_workers_are_refused_after_measuring_the_first_two():
    started = time.monotonic()
    with pytest.raises(FleetCapacityError, match=r"offline workers: each takes about"):
        run_offline(WIRING, shared_prefix_workload(num_requests=4), 10_000_000, "round_robin")
    assert time.monotonic() - started < 10  # refused before building the rest
