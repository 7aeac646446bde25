"""The live fleet: worker processes (spawned, ~1 s each to start on a small machine) on
free loopback ports, a router following their KV events, and workers that die."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path

import attrs
import msgspec
import pytest
import structlog
import zmq
from structlog.testing import capture_logs

from schedkit.components.io.io_struct import ErrorReply, RequestTimes, encode
from schedkit.core.schedule_batch import FinishLength, Req
from schedkit.fleet import worker as worker_module
from schedkit.fleet.launch import LAUNCHERS, ProcessLauncher
from schedkit.fleet.live import LiveFleet, WorkerStartError
from schedkit.fleet.stop_channel import StopChannel
from schedkit.fleet.worker import WorkerSpec, connect_stop, worker_main
from schedkit.fleet.workers import LiveWorkers
from schedkit.kv_events import KvIndex
from schedkit.workloads.traces import open_trace, write_mooncake_like
from schedkit.workloads.workload import shared_prefix_workload
from tests.components.io.test_output_sender import token_msg

WIRING = Path(__file__).resolve().parents[3] / "wiring.yaml"


def workload(num_requests: int, output_len: int = 16, rate: float = 40.0):
    return shared_prefix_workload(
        num_requests, groups=5, output_len=output_len, rate=rate, stream=True
    )


def outputs(*columns: tuple[str, list[int], object]) -> bytes:
    """A worker's output message: (rid, new tokens, finish reason or None) per request."""
    return encode(token_msg(*columns))


@pytest.fixture
def unstarted():
    """A fleet whose workers are not started, to feed worker messages to by hand."""
    fleet = LiveFleet(WIRING, 2, "round_robin")
    yield fleet
    fleet.close()


def in_flight(fleet: LiveFleet, rank: int, rid: str) -> Req:
    req = Req(rid=rid, origin_input_ids=[1, 2, 3, 4])
    fleet._inflight[rid] = (rank, req)
    fleet._load[rank] += 1
    return req


def test_itl_has_one_sample_per_token_after_the_first_when_messages_carry_several(unstarted):
    req = in_flight(unstarted, 0, "a")
    unstarted._receive(0, outputs(("a", [5, 6, 7], None)), 1.0)
    unstarted._receive(0, outputs(("a", [8, 9, 10], None)), 1.3)
    assert "a" in unstarted._inflight
    unstarted._receive(0, outputs(("a", [11], FinishLength(length=7))), 1.4)
    assert "a" not in unstarted._inflight and req.finished_reason == FinishLength(length=7)
    # The first message's other two tokens came with the first; the next three shared 0.3 s.
    assert req.itl == pytest.approx([0.0, 0.0, 0.1, 0.1, 0.1, 0.1])
    tally = unstarted._tallies[0]
    assert (tally.done, tally.output_tokens) == (1, 7)
    assert list(tally.ttft) == [1.0]
    # As in a single-scheduler run: n - 1 samples summing to last minus first token time,
    # so TPOT is their mean.
    assert len(tally.itl) == 7 - 1
    assert sum(tally.itl) == pytest.approx(1.4 - 1.0)
    assert list(tally.tpot) == pytest.approx([sum(tally.itl) / len(tally.itl)])


def test_queue_time_is_the_wait_to_leave_plus_the_wait_in_the_workers_scheduler(unstarted):
    req = in_flight(unstarted, 0, "a")
    req.arrival_time = 1.0
    unstarted._sent_at["a"] = 1.25  # it waited 0.25 s at the router
    message = token_msg(("a", [5], FinishLength(length=1)))
    # The worker's own clock: taken in at 100 s, admitted into a batch 0.5 s later.
    message.time_stats = [RequestTimes(arrival_time=100.0, scheduled_time=100.5)]
    unstarted._receive(0, encode(message), 2.0)
    assert req.scheduled_time == pytest.approx(1.75)
    assert list(unstarted._tallies[0].queue_time) == pytest.approx([0.75])
    assert "a" not in unstarted._sent_at


def test_a_refusal_from_another_worker_leaves_the_request_alone(unstarted):
    req = in_flight(unstarted, 0, "a")
    with capture_logs() as logs:
        unstarted._receive(1, encode(ErrorReply(message="no such request", rid="a")), 1.0)
        unstarted._receive(1, outputs(("a", [5], FinishLength(length=1))), 1.1)
    assert unstarted._inflight["a"] == (0, req)
    assert req.finished_reason is None and req.output_ids == []
    assert [e["event"] for e in logs] == ["fleet.output_from_wrong_worker"] * 2
    unstarted._receive(0, encode(ErrorReply(message="refused", rid="a")), 1.2)
    assert "a" not in unstarted._inflight
    # A refusal is counted as the worker's refusal, not as a failure or a latency.
    assert unstarted.dispatcher.refused == [1, 0]
    assert unstarted._tallies[0].failed == 0 and unstarted._failed == [0, 0]
    assert "refused" in req.finished_reason.message


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (b"\xc1", "invalid"),
        (msgspec.msgpack.encode({"kind": "token_ids", "rids": ["a"]}), "missing required field"),
        (msgspec.msgpack.encode({"kind": "tokens"}), "Invalid value 'tokens'"),
        (outputs(("a", [5], None))[:-3], "truncated"),
    ],
)
def test_a_message_that_does_not_decode_is_counted_and_logged(unstarted, payload, error):
    req = in_flight(unstarted, 0, "a")
    with capture_logs() as logs:
        unstarted._receive(0, payload, 1.0)
    assert unstarted.bad_messages == [1, 0]
    [entry] = logs
    assert entry["event"] == "fleet.bad_worker_message" and entry["worker"] == 0
    assert error in entry["error"]
    # A good message after it is taken in as usual.
    unstarted._receive(0, outputs(("a", [5], FinishLength(length=1))), 1.1)
    assert req.finished_reason == FinishLength(length=1)
    assert unstarted.alive == [True, True]


def test_an_output_whose_columns_differ_in_length_is_a_bad_message(unstarted):
    req = in_flight(unstarted, 0, "a")
    in_flight(unstarted, 0, "b")
    message = msgspec.msgpack.decode(outputs(("a", [5], None), ("b", [6], None)))
    message["output_ids"] = [[5]]
    with capture_logs() as logs:
        unstarted._receive(0, msgspec.msgpack.encode(message), 1.0)
    assert "rids 2, output_ids 1, finished_reasons 2" in logs[0]["error"]
    assert unstarted.bad_messages == [1, 0] and req.output_ids == []
    message = token_msg(("a", [5], FinishLength(length=1)))
    message.time_stats = []
    with capture_logs() as logs:
        unstarted._receive(0, encode(message), 1.0)
    assert "rids 1, output_ids 1, finished_reasons 1, time_stats 0" in logs[0]["error"]
    assert unstarted.bad_messages == [2, 0] and req.output_ids == []


GARBAGE = [
    b"\xc1",
    msgspec.msgpack.encode({"kind": "token_ids", "rids": ["a"]}),
    msgspec.msgpack.encode({"kind": "tokens"}),
]


def serve_garbage(spec: WorkerSpec, stop: threading.Event) -> None:
    """A worker that reports ready with a ROUTER endpoint and answers every message with
    ``GARBAGE``."""
    context = zmq.Context()
    requests, report = context.socket(zmq.ROUTER), context.socket(zmq.PUSH)
    stop_sub = connect_stop(context, spec)  # the fleet waits for it; the stop itself is unread
    try:
        port = requests.bind_to_random_port("tcp://127.0.0.1")
        report.connect(spec.report_endpoint)
        ready = {"pid": os.getpid(), "requests": f"tcp://127.0.0.1:{port}", "kv_events": None}
        ready |= {"replay": None, "page_size": 1, "topic": "", "profile": "sglang"}
        report.send(msgspec.msgpack.encode({"rank": spec.rank, "ready": ready}))
        while not stop.is_set():
            if requests.poll(20):
                identity, _ = requests.recv_multipart()
                for payload in GARBAGE:
                    requests.send_multipart([identity, payload])
    finally:
        requests.close(linger=0)
        report.close(linger=0)
        stop_sub.close(linger=0)
        context.term()


@attrs.define
class ThreadWorker:
    """Stands in for a worker process: ``target(spec, stop)`` on a thread, with a process
    handle's methods (``kill`` sets ``stop``)."""

    target: Callable[[WorkerSpec, threading.Event], None]
    spec: WorkerSpec
    stop: threading.Event = attrs.Factory(threading.Event)
    thread: threading.Thread | None = None
    sentinel: int = -1
    exited: int = -1
    pid: int = os.getpid()

    def start(self) -> ThreadWorker:
        self.sentinel, self.exited = os.pipe()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            self.target(self.spec, self.stop)
        finally:
            os.write(self.exited, b"x")

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def kill(self) -> None:
        self.stop.set()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def exit_reason(self) -> str:
        return "its thread returned"


@attrs.define
class ThreadLauncher:
    """Each worker a ``ThreadWorker`` running ``target``."""

    target: Callable[[WorkerSpec, threading.Event], None]
    handles: list[ThreadWorker] = attrs.Factory(list)

    def launch(self, spec: WorkerSpec) -> ThreadWorker:
        self.handles.append(ThreadWorker(self.target, spec).start())
        return self.handles[-1]

    def close(self) -> None:
        for handle in self.handles:
            os.close(handle.sentinel)
            os.close(handle.exited)


def test_a_worker_that_keeps_sending_garbage_is_taken_out(monkeypatch):
    monkeypatch.setitem(LAUNCHERS, "garbage", lambda: ThreadLauncher(serve_garbage))
    fleet = LiveFleet(WIRING, 1, "round_robin", launcher="garbage", max_bad_messages=3)
    with capture_logs() as logs, fleet:
        summary = fleet.run(workload(2, rate=1000.0))
    assert fleet.deaths == {
        0: "sent 3 messages in a row that do not decode (last: Invalid value 'tokens' - at "
        "`$.kind`)"
    }
    assert fleet.bad_messages == [3]
    assert summary.fleet.requests_failed == 2 and summary.fleet.requests_done == 0
    bad = [e for e in logs if e["event"] == "fleet.bad_worker_message"]
    assert [e["in_a_row"] for e in bad] == [1, 2, 3]


def test_every_request_completes_and_the_router_follows_the_kv_events(monkeypatch):
    seen, stamps = [], []
    apply = KvIndex.apply

    def applying(index, batch, rank=None):
        stamps.append(batch.ts)
        return apply(index, batch, rank)

    monkeypatch.setattr(KvIndex, "apply", applying)
    started = time.time()
    with LiveFleet(WIRING, 2, "kv") as fleet:
        summary = fleet.run(workload(24), progress=lambda done, t: seen.append((done, t)))
        index_ranks = fleet.router.index.ranks()
        pools = [fleet.router.index.capacity(rank) for rank in (0, 1)]
    # Live workers stamp their KV-event batches with the wall clock (offline: simulated time).
    assert stamps and started <= min(stamps) and max(stamps) <= time.time()
    assert summary.fleet.requests_done == 24
    assert seen[-1][0] == 24 and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert summary.setup_seconds > 0  # starting the workers, said apart from the run
    assert summary.fleet.requests_failed == 0
    assert sum(w.requests_routed for w in summary.workers) == 24
    assert [w.requests_done for w in summary.workers] == [
        w.requests_routed for w in summary.workers
    ]
    assert summary.fleet.output_tokens == 24 * 16
    # Five prompt families over two workers: later requests of a family find its prefix.
    assert summary.fleet.prefix_cache_hit_rate > 0.3
    assert index_ranks  # KV events arrived over the sockets
    # Each worker's index holds at most its pool, as its ready message gave it: the
    # wiring's 65,536 tokens in 16-token pages.
    assert pools == [4096, 4096]
    # Queue time from each worker's own report, up to its first admission: before its TTFT.
    f = summary.fleet
    assert 0 <= f.queue_time_p50_s <= f.queue_time_p99_s <= f.ttft_p99_s
    for worker in summary.workers:
        assert worker.alive
        assert worker.peak_rss_mib > 0  # reported by the worker process itself
        assert worker.ttft_p50_s > 0 and worker.e2e_p99_s >= worker.ttft_p99_s > 0
        assert worker.ttft_p90_s <= worker.ttft_p99_s
        assert len(worker.timeline.seconds) > 0  # its loads, sampled over the run
    assert fleet.deaths == {}


def test_a_killed_worker_is_noticed_and_the_rest_take_the_load():
    seen = {}

    def kill_worker_1(fleet: LiveFleet, sent: int) -> None:
        if sent == 12:
            seen["killed"] = time.monotonic()
            fleet.kill(1)

    with LiveFleet(WIRING, 3, "round_robin") as fleet:
        mark_dead = fleet._mark_dead

        def noticed(rank: int, why: str) -> None:
            seen["noticed"], seen["routed_then"] = time.monotonic(), fleet.routed[rank]
            mark_dead(rank, why)

        fleet._mark_dead = noticed
        summary = fleet.run(workload(36, output_len=64, rate=30.0), on_route=kill_worker_1)
    assert fleet.deaths == {1: "its process exited"}
    dead, *rest = summary.workers[1], summary.workers[0], summary.workers[2]
    assert not dead.alive
    # Noticed within a heartbeat of the kill; nothing went to worker 1 after that. (Arrivals
    # that fell due together with the one that triggered the kill may still go there: the
    # router sees the exit at its next poll.)
    assert seen["noticed"] - seen["killed"] < fleet.heartbeat_timeout
    assert dead.requests_routed == seen["routed_then"]
    assert dead.requests_failed > 0  # what it had in flight is reported failed
    assert dead.requests_done + dead.requests_failed == dead.requests_routed
    assert all(w.requests_failed == 0 and w.alive for w in rest)
    assert summary.fleet.requests_done + summary.fleet.requests_failed == 36
    assert summary.fleet.requests_failed == dead.requests_failed


def test_a_stopped_worker_stops_receiving_requests_within_about_a_second():
    seen = {"to_0": 0}

    def stop_worker_0(fleet: LiveFleet, sent: int) -> None:
        now = time.monotonic()
        if sent == 4:
            os.kill(fleet.handles[0].pid, signal.SIGSTOP)  # alive but answering nothing
            seen["stopped"] = now
        if fleet.routed[0] > seen["to_0"]:
            seen["to_0"], seen["last_to_0"] = fleet.routed[0], now

    # Round robin would keep sending to worker 0 for as long as it is in the routing.
    with LiveFleet(WIRING, 2, "round_robin") as fleet:  # default heartbeat timeout: 1 s
        summary = fleet.run(workload(60, rate=20.0), on_route=stop_worker_0)
    assert fleet.deaths == {0: "no heartbeat for 1 s"}
    late = seen["last_to_0"] - seen["stopped"]
    print(f"last request to the stopped worker {late:.2f} s after SIGSTOP")
    assert late < 1.5
    assert summary.fleet.requests_done + summary.fleet.requests_failed == 60
    assert summary.workers[0].requests_routed < 30 and summary.workers[1].requests_done > 30


def test_the_router_is_a_trusted_client_sized_to_the_worker(tmp_path):
    """A 1,200-request Mooncake-shaped burst on 2 workers: each holds more than the 2^20
    prompt tokens a single hostile client may make a server hold, and nothing is refused.
    The model runs 10x faster than the default wiring's and the trace twice as fast as the
    command in docs/fleet.md (speedup 16), to keep the test short; the workers still hold
    more than 2^20 prompt tokens each, the CPU being the bottleneck."""
    trace = write_mooncake_like(tmp_path / "t.jsonl", 1200, rate=32)
    faster = tmp_path / "faster.yaml"
    faster.write_text(
        "components:\n  model_runner:\n    args:\n"
        "      prefill_fixed: 0.0005\n      prefill_per_token: 4.0e-6\n"
        "      attention_coeff: 1.3e-10\n      decode_fixed: 0.0007\n"
        "      decode_per_seq: 4.0e-6\n      decode_per_kv_token: 3.9e-9\n"
    )
    workload_ = open_trace(trace, "mooncake", speedup=16.0)
    with LiveFleet(WIRING, 2, "kv", overlays=[faster]) as fleet:
        summary = fleet.run(workload_)
    f = summary.fleet
    print(f"done {f.requests_done}, refused {f.requests_refused}, failed {f.requests_failed}")
    assert (f.requests_done, f.requests_refused, f.requests_failed) == (1200, 0, 0)
    assert max(w.peak_held_prompt_tokens for w in summary.workers) > 2**20


def worker_on_a_thread(spec: WorkerSpec, _: threading.Event) -> None:
    """``worker_main`` on a thread of this process, which is not the worker's parent."""
    worker_main(attrs.evolve(spec, parent_pid=None))


def test_workers_closed_as_soon_as_they_started_stop_at_once(monkeypatch):
    """A stop sent the moment ``start()`` returns reaches the worker: it counts as ready only
    once the fleet has its subscription to the stop, not when it reports ready (the stop sent
    before it subscribed was lost, and ``close()`` waited out the grace + 10 s, then 5 s more
    before it killed the worker)."""
    monkeypatch.setitem(LAUNCHERS, "thread", lambda: ThreadLauncher(worker_on_a_thread))
    for _ in range(3):
        workers = LiveWorkers(WIRING, 1, launcher="thread", grace=10.0, cap_workers=False)
        workers.start()
        started = time.monotonic()
        workers.close()
        took = time.monotonic() - started
        assert took < workers.grace / 2, f"close() took {took:.1f} s"
        assert list(workers.stats) == [0]  # it stopped by itself and reported


def test_a_worker_that_subscribes_to_its_stop_after_the_fleet_gave_up_still_gets_it(monkeypatch):
    """Worker 0 fails while worker 1 is still starting: ``start()`` raises and ``close()``
    sends worker 1 its stop as soon as its subscription arrives."""
    closing, got = threading.Event(), {}

    def worker(spec: WorkerSpec, _: threading.Event) -> None:
        context = zmq.Context()
        report = context.socket(zmq.PUSH)
        report.connect(spec.report_endpoint)
        try:
            if spec.rank == 0:
                report.send(msgspec.msgpack.encode({"rank": 0, "error": "no device"}))
                return
            closing.wait(10)
            sub = connect_stop(context, spec)
            got["stop"] = sub.poll(10_000) and sub.recv()
            sub.close(linger=0)
            report.send(msgspec.msgpack.encode({"rank": 1, "stats": {"uptime_seconds": 0}}))
        finally:
            report.close(linger=1000)
            context.term()

    class Watched(LiveWorkers):
        def close(self) -> None:
            closing.set()
            super().close()

    monkeypatch.setitem(LAUNCHERS, "thread", lambda: ThreadLauncher(worker))
    workers = Watched(WIRING, 2, launcher="thread", grace=10.0, cap_workers=False)
    started = time.monotonic()
    with pytest.raises(WorkerStartError, match=r"^worker 0: no device$"):
        workers.start()
    assert got["stop"] == b"stop 1\n" and workers.stats == {1: {"uptime_seconds": 0}}
    assert time.monotonic() - started < workers.grace / 2


def test_a_worker_that_cannot_start_is_reported(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("components:\n  scheduler:\n    args:\n      max_running_requests: 0\n")
    where = re.escape(f"{bad}:4: components.scheduler.args.max_running_requests")
    with pytest.raises(WorkerStartError, match=rf"^worker 0: {where}: .* got 0$"):
        LiveFleet(WIRING, 1, "round_robin", overlays=[bad]).start()


def test_any_exception_of_a_starting_worker_is_reported_with_its_type_and_place(monkeypatch):
    def broken_build(wiring):
        raise RuntimeError("the device is gone")

    monkeypatch.setattr(worker_module, "build", broken_build)
    monkeypatch.setitem(LAUNCHERS, "thread", lambda: ThreadLauncher(lambda s, _: worker_main(s)))
    fleet = LiveFleet(WIRING, 1, "round_robin", launcher="thread")
    with pytest.raises(WorkerStartError) as raised:
        fleet.start()
    here = Path(__file__).name
    assert re.fullmatch(
        rf"worker 0: RuntimeError: the device is gone \(at .*{here}:\d+\)", str(raised.value)
    )


def test_a_worker_on_a_main_thread_restores_the_signal_handlers_and_logging_it_replaced(
    monkeypatch, capsys
):
    """While it runs, a worker on a main thread ignores SIGINT (Ctrl-C is its parent's),
    stops on SIGTERM and logs to stderr; the process it returns to gets its own handlers and
    logging setup back."""
    seen = {}

    def broken_build(wiring):
        seen["sigint"] = signal.getsignal(signal.SIGINT)
        structlog.get_logger("worker").error("worker.logs_to_stderr")
        raise RuntimeError("the device is gone")

    monkeypatch.setattr(worker_module, "build", broken_build)
    quiet = structlog.make_filtering_bound_logger(logging.ERROR)
    structlog.configure(wrapper_class=quiet)
    logging_before = structlog.get_config()
    context = zmq.Context()
    report = context.socket(zmq.PULL)
    port = report.bind_to_random_port("tcp://127.0.0.1")
    stop = StopChannel(context, 1)
    spec = WorkerSpec(str(WIRING), (), 0, 1, f"tcp://127.0.0.1:{port}", stop.endpoint)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        worker_main(spec)
        assert report.poll(10_000)
        assert "the device is gone" in msgspec.msgpack.decode(report.recv())["error"]
    finally:
        report.close(linger=0)
        stop.close()
        context.term()
    assert seen["sigint"] is signal.SIG_IGN
    out, err = capsys.readouterr()
    assert "worker.logs_to_stderr" in err and "worker.logs_to_stderr" not in out
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert structlog.get_config() == logging_before


def test_a_worker_that_exits_without_a_report_is_said_to_with_its_exit_code(monkeypatch):
    def launch_exit_3(spec: WorkerSpec) -> BaseProcess:
        process = multiprocessing.get_context("spawn").Process(target=os._exit, args=(3,))
        process.start()
        return process

    monkeypatch.setattr(ProcessLauncher, "launch", staticmethod(launch_exit_3))
    with pytest.raises(
        WorkerStartError, match=r"^worker 0 exited before it was ready \(exit code 3\)$"
    ):
        LiveFleet(WIRING, 1, "round_robin").start()


def test_nothing_imports_ray_unless_its_launcher_is_chosen():
    code = (
        "import sys, schedkit.cli, schedkit.fleet.live\n"
        "from schedkit.fleet.launch import ProcessLauncher\n"
        "ProcessLauncher().close()\n"
        "sys.exit('ray' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_ray_launcher_without_ray_says_how_to_install_it():
    try:
        import ray  # noqa: F401
    except ImportError:
        with pytest.raises(WorkerStartError, match=r"pip install 'schedkit\[ray\]'"):
            LiveFleet(WIRING, 1, "round_robin", launcher="ray").start()
    else:
        pytest.skip("Ray is installed")


def _running() -> dict[int, int]:
    """Every process that is not a zombie, with its parent, from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
                if state != "Z":
                    parents[int(entry.name)] = int(ppid)
    return parents


def _descendants(pid: int) -> set[int]:
    parents, found, frontier = _running(), set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _still_running(pids: set[int], timeout: float = 10.0) -> set[int]:
    """Those of ``pids`` still running after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := pids & _running().keys()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_ray_launcher_workers_are_actors_and_ray_is_shut_down_after():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("this test starts and stops its own Ray")
    seen = {}
    before = _descendants(os.getpid())  # e.g. multiprocessing's resource tracker

    def kill_worker_1(fleet: LiveFleet, sent: int) -> None:
        if sent == 6:
            seen["routed_to_1"] = fleet.routed[1]
            seen["ray_processes"] = _descendants(os.getpid()) - before
            fleet.kill(1)

    # Heartbeats far apart: only the actor's sentinel can show the kill within the run.
    fleet = LiveFleet(
        WIRING, 2, "round_robin", launcher="ray", heartbeat_interval=30.0, heartbeat_timeout=60.0
    )
    with fleet:
        actors = {w["pid"] for w in fleet.endpoints.values()}
        assert os.getpid() not in actors and len(actors) == 2
        for ready in fleet.endpoints.values():
            assert ready["requests"].startswith("tcp://127.0.0.1:")
            assert ready["kv_events"].startswith("tcp://127.0.0.1:")
        summary = fleet.run(workload(24, output_len=64, rate=30.0), on_route=kill_worker_1)
    assert fleet.deaths == {1: "its process exited"}
    dead, alive = summary.workers[1], summary.workers[0]
    assert dead.requests_routed <= seen["routed_to_1"] + 1
    assert dead.requests_done + dead.requests_failed == dead.requests_routed
    assert alive.requests_failed == 0 and alive.requests_done == alive.requests_routed > 0
    assert alive.peak_rss_mib > 0  # the surviving actor reported its figures
    assert summary.fleet.requests_done + summary.fleet.requests_failed == 24
    # The fleet started Ray, so it shut it down: its daemons and the actors are gone.
    assert not ray.is_initialized()
    assert actors <= seen["ray_processes"]
    assert _still_running(seen["ray_processes"]) == set()


def test_ray_launcher_leaves_a_ray_it_did_not_start_running():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("this test starts and stops its own Ray")
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        with LiveFleet(WIRING, 1, "round_robin", launcher="ray") as fleet:
            actor = fleet.endpoints[0]["pid"]
            summary = fleet.run(workload(4))
        assert summary.fleet.requests_done == 4
        assert ray.is_initialized()
        assert _still_running({actor}) == set()  # the fleet's actor is killed all the same
    finally:
        ray.shutdown()


def test_a_worker_that_reads_slowly_gets_its_requests_later_and_stays_in():
    """A full request socket is back pressure, not a dead worker: the requests wait in that
    worker's outbox here (still in flight on it) and go out, in order, as it reads."""
    from schedkit.router import RoundRobin, Router

    context = zmq.Context.instance()
    worker = context.socket(zmq.ROUTER)
    worker.setsockopt(zmq.RCVHWM, 1)
    worker.setsockopt(zmq.RCVBUF, 1 << 16)  # small kernel buffers: the queue fills for sure
    worker.bind("tcp://127.0.0.1:0")
    fleet = LiveFleet(WIRING, 1, "round_robin")
    dealer = fleet._context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.SNDHWM, 1)
    dealer.setsockopt(zmq.SNDBUF, 1 << 16)
    dealer.connect(worker.getsockopt_string(zmq.LAST_ENDPOINT))
    fleet._dealers.append(dealer)
    fleet._poller.register(dealer, zmq.POLLIN)
    fleet.router = Router([0], 1, RoundRobin(), fleet._load.__getitem__)
    try:
        for i in range(12):  # ~1 MB each: far more than the sockets hold unread
            req = Req(rid=f"r{i}", origin_input_ids=list(range(250_000)))
            req.arrival_time = 0.0
            fleet.dispatcher.arrive(req)
        fleet._take_out_doomed()
        assert fleet.alive == [True] and fleet.deaths == {}
        assert len(fleet._inflight) == 12 and fleet._outboxes[0]
        received = []
        deadline = time.monotonic() + 20
        while len(received) < 12 and time.monotonic() < deadline:
            if worker.poll(50):
                _, payload = worker.recv_multipart()
                received.append(msgspec.msgpack.decode(payload)["rid"])
            fleet._flush(0)
        assert received == [f"r{i}" for i in range(12)] and not fleet._outboxes[0]
    finally:
        fleet.close()
        worker.close(linger=0)


def test_the_workers_limits_for_the_router_are_its_whole_capacity():
    from schedkit.fleet.offline import worker_wiring
    from schedkit.fleet.worker import serve_overlay, trusted_client_overlay

    wiring = worker_wiring(WIRING, [serve_overlay()], 0, 1)
    defaults = trusted_client_overlay(wiring, None, None)["components"]["request_receiver"]
    args = defaults["args"]
    assert args["max_waiting_tokens_per_client"] == args["max_waiting_tokens"] == 4 << 20
    assert args["max_waiting_requests_per_client"] == args["max_waiting_requests"] == 4096
    sized = trusted_client_overlay(wiring, 64, 100_000)["components"]["request_receiver"]
    sized = sized["args"]
    assert sized["max_waiting_requests_per_client"] == sized["max_waiting_requests"] == 64
    assert sized["max_waiting_tokens_per_client"] == sized["max_waiting_tokens"] == 100_000
    overlay = {"components": {"request_receiver": {"args": sized}}}
    built = worker_wiring(WIRING, [serve_overlay(), overlay], 0, 1)
    assert built.components["request_receiver"].args["max_waiting_tokens_per_client"] == 100_000


def test_a_worker_gets_every_field_its_scheduler_reads():
    """The request a live worker gets rebuilds the router's ``Req``: the cache namespace
    (``extra_key``, ``cache_salt``) included, or the worker's KV events would hash apart from
    the router's own hashes of the prompt."""
    from array import array

    from schedkit.components.io.io_struct import decode_request
    from schedkit.core.schedule_batch import SamplingParams
    from schedkit.fleet.live_sending import _generate_message

    params = SamplingParams(
        max_new_tokens=7,
        stop_token_ids=(3,),
        ignore_eos=True,
        stream_interval=2,
        min_new_tokens=4,
    )
    req = Req(
        rid="r",
        origin_input_ids=array("I", [1, 2, 3]),
        sampling_params=params,
        priority=5,
        extra_key="tenant",
        cache_salt="salt",
    )
    rebuilt = decode_request(encode(_generate_message(req))).to_req()
    assert list(rebuilt.origin_input_ids) == [1, 2, 3]
    assert (rebuilt.priority, rebuilt.extra_key, rebuilt.cache_salt) == (5, "tenant", "salt")
    assert rebuilt.sampling_params == attrs.evolve(params, stream=True)
