"""The suite on two pytest-xdist workers (``-n 2 --dist loadfile``, which ``.ci/run`` sets in
``PYTEST_ADDOPTS``), with every test that reads the wall clock still running alone.

A test runs beside another only if its file (or its ``file::name`` prefix) is listed in
``BESIDE_OTHERS``: computations whose results do not depend on how fast they run (unit tests
without sockets, threads or processes; offline replays on the simulated clock; scripts whose
printed format is checked, not their figures). Every other test (latency bounds, timeouts,
heartbeats, live fleets, servers) holds the suite's lock alone: the other worker waits
before its next test, so such a test sees the machine as a serial run would. A file not
listed is a file whose tests run alone, which is the safe default for a new one. Under
xdist, the listed files are scheduled first, so that both workers run them together (in this
order, not xdist's default of the files with the most tests first).

The lock is two ``flock`` files in a directory that the first process creates and every
worker inherits (``SCHEDKIT_TEST_SHARED``): a test alone takes the turnstile, then the lock,
exclusively; a test beside others passes the turnstile and takes the lock shared, so a test
waiting to run alone is not overtaken.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

SHARED = "SCHEDKIT_TEST_SHARED"

BESIDE_OTHERS = (
    "tests/benchmarks/test_bench_fleet.py",
    "tests/benchmarks/test_bench_http.py",
    "tests/benchmarks/test_bench_kv_events.py",
    "tests/benchmarks/test_bench_offline_fleet.py",
    "tests/benchmarks/test_bench_overload.py",
    "tests/benchmarks/test_bench_serve_hostile.py",
    "tests/benchmarks/test_bench_summary_memory.py",
    "tests/benchmarks/test_nano_vllm_reference.py",
    "tests/benchmarks/test_policy_seeds.py",
    "tests/components/cache/test_allocator.py",
    "tests/components/cache/test_cache_events_stateful.py",
    "tests/components/cache/test_cache_keys.py",
    "tests/components/cache/test_hiradix_cache.py",
    "tests/components/cache/test_introspection.py",
    "tests/components/cache/test_radix_cache.py",
    "tests/components/cache/test_sglang_api.py",
    "tests/components/cache/test_slot_pages.py",
    "tests/components/cache/test_swa_fine_points.py",
    "tests/components/cache/test_swa_radix_cache.py",
    "tests/components/io/test_admin_controls.py",
    "tests/components/io/test_edge_backlog.py",
    "tests/components/io/test_edge_messages.py",
    "tests/components/io/test_fair_release.py",
    "tests/components/io/test_io_struct.py",
    "tests/components/io/test_output_streamer.py",
    "tests/components/metrics/test_collector.py",
    "tests/components/metrics/test_observe_many.py",
    "tests/components/metrics/test_parity.py",
    "tests/components/metrics/test_reporter.py",
    "tests/components/scheduler/test_batch_result_processor.py",
    "tests/components/scheduler/test_batching.py",
    "tests/components/scheduler/test_cache_agnostic_policies.py",
    "tests/components/scheduler/test_cache_aware_policies.py",
    "tests/components/scheduler/test_client_share.py",
    "tests/components/scheduler/test_decode_pages.py",
    "tests/components/scheduler/test_decode_tokens.py",
    "tests/components/scheduler/test_load_inquirer.py",
    "tests/components/scheduler/test_prefill_step_bound.py",
    "tests/components/scheduler/test_schedule_policy.py",
    "tests/components/scheduler/test_waiting_queue.py",
    "tests/components/test_registry.py",
    "tests/docs/test_architecture.py",
    "tests/docs/test_blocks.py",
    "tests/examples/test_custom_policy.py",
    "tests/examples/test_isolated_component.py",
    "tests/examples/test_swap_for_mock.py",
    "tests/schedkit/assembly/test_argument_checks.py",
    "tests/schedkit/assembly/test_container.py",
    "tests/schedkit/assembly/test_overlays.py",
    "tests/schedkit/assembly/test_signatures.py",
    "tests/schedkit/assembly/test_validate.py",
    "tests/schedkit/assembly/test_wiring.py",
    "tests/schedkit/assembly/test_wiring_safety.py",
    # all but the alias expansion's, which is timed
    "tests/schedkit/assembly/test_yaml_values.py::test_deep_nesting_",
    "tests/schedkit/assembly/test_yaml_values.py::test_non_utf8_",
    "tests/schedkit/cli/test_args.py",
    "tests/schedkit/cli/test_calibrate_cli.py",
    "tests/schedkit/cli/test_files.py",
    # the offline runs; the live one (test_live_json_summary) runs alone
    "tests/schedkit/cli/test_fleet.py::test_a_speedup_sweep_",
    "tests/schedkit/cli/test_fleet.py::test_bad_workload_file_",
    "tests/schedkit/cli/test_fleet.py::test_closed_loop_admission_",
    "tests/schedkit/cli/test_fleet.py::test_failed_requests_exit_",
    "tests/schedkit/cli/test_fleet.py::test_kv_settings_reach_",
    "tests/schedkit/cli/test_fleet.py::test_offline_",
    "tests/schedkit/cli/test_fleet.py::test_router_names_and_settings_",
    "tests/schedkit/cli/test_fleet_args.py",
    "tests/schedkit/cli/test_help.py",
    "tests/schedkit/cli/test_http_step_bound.py",
    "tests/schedkit/cli/test_presets_cli.py",
    "tests/schedkit/cli/test_run_traces.py",
    "tests/schedkit/cli/test_workload_args.py",
    "tests/schedkit/core/test_component.py",
    "tests/schedkit/core/test_parallel_state.py",
    "tests/schedkit/core/test_protocols.py",
    "tests/schedkit/core/test_schedule_batch.py",
    "tests/schedkit/fleet/test_admission.py",
    "tests/schedkit/fleet/test_control_replies.py",
    "tests/schedkit/fleet/test_events.py",
    "tests/schedkit/fleet/test_offline.py",
    "tests/schedkit/fleet/test_offline_pinned.py",
    "tests/schedkit/fleet/test_replay.py",
    "tests/schedkit/fleet/test_router_news.py",
    "tests/schedkit/fleet/test_summary.py",
    "tests/schedkit/fleet/test_workers.py",
    # waits out the front end's send timeout, with a minute's deadline
    "tests/schedkit/http/test_hostile_http.py::test_a_client_that_never_reads_its_stream_",
    "tests/schedkit/http/test_key_admission.py",
    "tests/schedkit/http/test_launcher.py",
    "tests/schedkit/http/test_tokenizer.py",
    "tests/schedkit/kv_events/test_conformance.py",
    "tests/schedkit/kv_events/test_hashing.py",
    "tests/schedkit/kv_events/test_index.py",
    "tests/schedkit/kv_events/test_index_decode.py",
    "tests/schedkit/kv_events/test_null_publisher.py",
    "tests/schedkit/kv_events/test_packed_ids.py",
    "tests/schedkit/kv_events/test_page_chain.py",
    "tests/schedkit/kv_events/test_published_hashes.py",
    "tests/schedkit/kv_events/test_wire_profiles.py",
    "tests/schedkit/kv_events/test_wire_shape.py",
    "tests/schedkit/router/test_approx_tree.py",
    # the offline runs; the live one (test_live_...) runs alone
    "tests/schedkit/router/test_directions.py::test_cache_aware_",
    "tests/schedkit/router/test_directions.py::test_no_policy_",
    "tests/schedkit/router/test_pending.py",
    "tests/schedkit/router/test_policies.py",
    # the offline fleet only
    "tests/schedkit/router/test_router.py::test_an_offline_fleet_",
    "tests/schedkit/runner/test_calibrate.py",
    "tests/schedkit/runner/test_calibration_csv.py",
    "tests/schedkit/runner/test_presets.py",
    "tests/schedkit/runner/test_specs.py",
    "tests/schedkit/runner/test_time_scale.py",
    "tests/schedkit/sim/test_plot.py",
    "tests/schedkit/sim/test_run_summary.py",
    "tests/schedkit/test_routing_ids.py",
    "tests/schedkit/test_endpoints.py",
    "tests/schedkit/test_logs.py",
    "tests/schedkit/testing/test_doubles.py",
    "tests/schedkit/testing/test_fake_interface.py",
    "tests/schedkit/testing/test_fakes.py",
    "tests/schedkit/testing/test_isolation.py",
    "tests/schedkit/workloads/test_arrivals.py",
    "tests/schedkit/workloads/test_hostile_traces.py",
    "tests/schedkit/workloads/test_json_array.py",
    "tests/schedkit/workloads/test_order_statistics.py",
    "tests/schedkit/workloads/test_samples.py",
    "tests/schedkit/workloads/test_shaped.py",
    "tests/schedkit/workloads/test_sniff.py",
    "tests/schedkit/workloads/test_sort_window.py",
    "tests/schedkit/workloads/test_trace_io.py",
    "tests/schedkit/workloads/test_traces.py",
    "tests/schedkit/workloads/test_workload.py",
    "tests/test_first_hour.py",
    "tests/test_hicache_end_to_end.py",
    "tests/test_layering.py",
    "tests/test_logging_state.py",
    "tests/test_packaging.py",
    "tests/test_parallel.py",
    "tests/test_policies_end_to_end.py",
    "tests/test_repository.py",
    # a refusal before the run; the runs and the servers run alone
    "tests/test_scheduler_end_to_end.py::test_schedkit_run_reports_bad_workload_lines",
    "tests/test_swa_end_to_end.py",
)


def beside_others(nodeid: str) -> bool:
    """Whether the test ``nodeid`` may run while another test runs."""
    return nodeid.startswith(BESIDE_OTHERS)


def file_first(nodeid: str) -> int:
    """Sort key of a test's file: 0 if every test of the file runs beside others, 1 if some
    do, else 2."""
    file = nodeid.split("::", 1)[0]
    if file in BESIDE_OTHERS:
        return 0
    return 1 if any(entry.split("::", 1)[0] == file for entry in BESIDE_OTHERS) else 2


def run_order(nodeids: list[str]) -> list[int]:
    """The order to run ``nodeids`` in on xdist workers, as indices into it: files whose tests
    all run beside others, then files where some do, then the rest, each in its collection
    order; within a file, its tests that run beside others first. A test that runs alone
    while the other worker is in a test beside others waits for it with its own worker idle:
    so that this happens at most once, those come last."""
    position: dict[str, int] = {}
    for nodeid in nodeids:
        position.setdefault(nodeid.split("::", 1)[0], len(position))

    def key(index: int) -> tuple[int, int, bool]:
        nodeid = nodeids[index]
        file = nodeid.split("::", 1)[0]
        return file_first(nodeid), position[file], not beside_others(nodeid)

    return sorted(range(len(nodeids)), key=key)


def on_a_worker() -> bool:
    """Whether this process is a pytest-xdist worker."""
    return "PYTEST_XDIST_WORKER" in os.environ


def shared_directory() -> tuple[Path, bool]:
    """The directory this session's processes share, and whether this process made it (and
    so removes it at the end)."""
    if os.environ.get(SHARED):
        return Path(os.environ[SHARED]), False
    made = tempfile.mkdtemp(prefix="schedkit-tests-")
    os.environ[SHARED] = made
    return Path(made), True


def remove(where: Path) -> None:
    """Remove the shared directory."""
    shutil.rmtree(where, ignore_errors=True)


@contextlib.contextmanager
def turn(where: Path, alone: bool) -> Iterator[None]:
    """Hold the suite's lock while a test runs: alone (exclusive) or beside others (shared)."""
    with open(where / "turnstile.lock", "a") as turnstile, open(where / "test.lock", "a") as lock:
        if alone:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_SH)
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@contextlib.contextmanager
def one_at_a_time(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across the session's processes."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
