"""The run driver: arrivals pulled as the clock reaches them, finished requests let go,
per-request records, a partial summary on Ctrl-C."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest

import schedkit
from schedkit.core.schedule_batch import Req, SamplingParams
from schedkit.sim.driver import Stepper, drive
from schedkit.workloads.samples import Tally, percentiles
from schedkit.workloads.workload import Arrival, GeneratedWorkload

ROOT = Path(__file__).resolve().parents[3]
QUIET = {
    "components": {
        "kv_events_publisher": {"args": {"kv_events_config": None}},
    }
}


@pytest.fixture
def assembly():
    built = schedkit.build(schedkit.load_wiring(ROOT / "wiring.yaml", QUIET))
    yield built
    built.shutdown()


def req(i: int) -> Req:
    return Req(
        rid=f"r{i}",
        origin_input_ids=[10 + i] * 64,
        sampling_params=SamplingParams(max_new_tokens=8),
    )


def test_arrivals_are_pulled_only_when_the_clock_reaches_them(assembly):
    clock = assembly["model_runner"]
    pulled_at: list[float] = []

    def arrivals():
        for i in range(10):
            pulled_at.append(clock.now())
            yield Arrival(float(i), req(i))

    start = clock.now()
    summary = drive(assembly, GeneratedWorkload(arrivals))
    assert summary.requests_done == 10
    # Arrival i is made only once arrival i - 1 was due (i - 1 seconds in).
    for i in range(1, 10):
        assert pulled_at[i] - start >= i - 1


def test_a_rid_already_in_flight_is_refused(assembly):
    workload = GeneratedWorkload(lambda: iter([Arrival(0.0, req(1)), Arrival(0.0, req(1))]))
    with pytest.raises(ValueError, match="rid 'r1' is already in flight"):
        drive(assembly, workload)


def test_a_decode_run_leaves_a_request_refused_at_submission_to_the_next_step():
    counted = {"components": {"output_sender": {"args": {"encode": False}}}}  # runs stream
    assembly = schedkit.build(schedkit.load_wiring(ROOT / "wiring.yaml", QUIET, counted))
    stepper = Stepper(assembly)
    streaming = SamplingParams(max_new_tokens=128, stream=True)
    stepper.submit(0.0, Req(rid="r", origin_input_ids=[3] * 64, sampling_params=streaming))
    for _ in range(3):  # prefilled, then decoding
        stepper.step()
    assert stepper.run_decode(until=100.0, max_steps=4) is not None
    too_long = Req(rid="long", origin_input_ids=[7] * 70000)  # past the pool: refused
    stepper.submit(stepper.elapsed(), too_long)
    assert stepper.run_decode(until=100.0) is None
    start = stepper.elapsed()
    ran, finished = stepper.step()  # hands it back at its end, as step by step does
    assert ran and [r.rid for r in finished] == ["long"] and stepper.elapsed() > start
    assert stepper.run_decode(until=100.0, max_steps=4) is not None
    stepper.close()
    assembly.shutdown()


def test_finished_requests_are_let_go(assembly):
    refs = []

    def arrivals():
        for i in range(50):
            r = req(i)
            refs.append(weakref.ref(r))
            yield Arrival(0.0, r)

    records = []
    summary = drive(
        assembly, GeneratedWorkload(arrivals), on_finish=lambda r: records.append(r.rid)
    )
    gc.collect()
    assert summary.requests_done == 50 and summary.output_tokens == 400
    assert sorted(records) == sorted(f"r{i}" for i in range(50))
    assert [r for r in refs if r() is not None] == []
    assert summary.peak_rss_mb > 0 and not summary.interrupted


def test_ctrl_c_stops_the_run_even_when_its_keyboardinterrupt_is_lost(assembly):
    # Python drops a KeyboardInterrupt raised inside a finalizer that a collection runs; the
    # run must stop anyway.
    def lost_ctrl_c(_req: Req) -> None:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)  # the handler runs here at the latest
        except KeyboardInterrupt:
            pass

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a shell starts it
    try:
        summary = drive(
            assembly,
            GeneratedWorkload(lambda: (Arrival(i * 0.05, req(i)) for i in range(200))),
            on_finish=lost_ctrl_c,
        )
        assert summary.interrupted and 0 < summary.requests_done < 200
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def run(*args: str, **kwargs) -> subprocess.Popen:
    env = {
        **os.environ,
        "SCHEDKIT_KV_EVENTS_ENDPOINT": "tcp://127.0.0.1:0",
        "SCHEDKIT_KV_REPLAY_ENDPOINT": "tcp://127.0.0.1:0",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "schedkit.cli", "run", "wiring.yaml", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_output_writes_one_record_per_request(tmp_path):
    out = tmp_path / "records.jsonl"
    proc = run("--num-requests", "30", "--json", "--output", str(out))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 30 == summary["requests_done"]
    assert len({r["rid"] for r in records}) == 30
    assert sum(r["output_tokens"] for r in records) == summary["output_tokens"]
    assert all(r["ttft"] > 0 and r["latency"] >= r["ttft"] for r in records)
    assert all(r["finish"]["type"] in ("length", "stop") for r in records)


def _sigint_as_a_shell_leaves_it() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_prints_the_summary_so_far(tmp_path):
    records = tmp_path / "records.jsonl"
    proc = run(
        "--num-requests",
        "100000",
        "--json",
        "--output",
        str(records),
        preexec_fn=_sigint_as_a_shell_leaves_it,  # not what this process may have set
    )
    # Interrupted once requests have finished: their records reach the file.
    deadline = time.monotonic() + 60
    while not (records.exists() and records.stat().st_size):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no request finished within 60 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    summary = json.loads(stdout)
    assert summary["interrupted"] is True
    assert 0 < summary["requests_done"] < 100000
    # Every request counted has its record; the one being recorded at Ctrl-C may be uncounted.
    written = len(records.read_text().splitlines())
    assert summary["requests_done"] <= written <= summary["requests_done"] + 1
    assert "Traceback" not in stderr


@pytest.mark.parametrize(("option", "value"), [("--rate", "nan"), ("--grace", "-1")])
def test_nonsense_numbers_are_refused(option, value):
    command = "serve" if option == "--grace" else "run"
    result = subprocess.run(
        [sys.executable, "-m", "schedkit.cli", command, "wiring.yaml", option, value],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"argument {option}: expected" in result.stderr


def test_summary_percentiles_and_samples_come_from_the_finished_requests(assembly):
    scheduler = assembly["scheduler"]
    wired_on_finish = scheduler.on_finish
    reqs = [req(i) for i in range(30)]
    samples = Tally()
    summary = drive(
        assembly,
        GeneratedWorkload(lambda: (Arrival(0.02 * i, r) for i, r in enumerate(reqs))),
        samples=samples,
    )
    assert scheduler.on_finish == wired_on_finish  # the driver's hook is removed again
    assert summary.requests_done == samples.done == 30
    e2e = [r.finish_time - r.arrival_time for r in reqs]
    queue = [r.scheduled_time - r.arrival_time for r in reqs]
    tpot = [(r.finish_time - r.first_token_time) / (len(r.output_ids) - 1) for r in reqs]
    for name, values in (("e2e", e2e), ("queue_time", queue), ("tpot", tpot)):
        assert sorted(getattr(samples, name)) == pytest.approx(sorted(values)), name
        expected = percentiles(values)
        got = [getattr(summary, f"{name}_p{q}") for q in (50, 90, 99)]
        assert got == pytest.approx(expected), name
    assert min(queue) >= 0 and max(tpot) > 0
    as_json = summary.to_dict()
    assert {"tpot_p50_s", "e2e_p99_s", "queue_time_p90_s", "ttft_p50_s", "itl_p99_s"} <= set(
        as_json
    )
    table = summary.table()
    assert "TPOT p50 / p90 / p99 (ms)" in table and "queue time p50 / p90 / p99 (s)" in table
    # the timeline saw the queue fill and drain, one sample per step (the run is short)
    assert samples.timeline.stride == 1 and max(samples.timeline.running) > 1
    assert list(samples.timeline.seconds) == sorted(samples.timeline.seconds)
