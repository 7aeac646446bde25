from pathlib import Path

import pytest

from schedkit import WiringError, load_wiring
from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.metrics.reporter import MetricsReporter
from schedkit.components.scheduler.scheduler import Scheduler
from schedkit.core.schedule_batch import (
    FinishLength,
    ForwardMode,
    GenerationBatchResult,
    Req,
    SamplingParams,
    ScheduleBatch,
)
from schedkit.runner.model_runner import SimulatedModelRunner
from schedkit.testing import isolate

WIRING = Path(__file__).resolve().parents[3] / "wiring.yaml"


def test_every_neighbour_is_a_fake_carrying_its_configured_values():
    isolated = isolate("scheduler", WIRING)
    scheduler, fakes = isolated.component, isolated.fakes
    assert isinstance(scheduler, Scheduler)
    assert set(fakes) == {
        "request_receiver",
        "allocator",
        "tree_cache",
        "policy",
        "model_runner",
        "batch_result_processor",
        "kv_events_publisher",
        "metrics_reporter",
        "load_inquirer",
    }
    assert isinstance(fakes["allocator"], TokenToKVPoolAllocator)
    assert (fakes["allocator"].size, fakes["allocator"].page_size) == (65536, 16)
    # page_size: !ref allocator.page_size in the cache's entry is read from the allocator fake
    assert fakes["tree_cache"].page_size == 16
    assert scheduler.model_runner is fakes["model_runner"]
    assert isolated.arguments["max_running_requests"] == 256


def test_late_calls_reach_the_fakes_recording_methods():
    isolated = isolate("scheduler", WIRING)
    scheduler, fakes = isolated.component, isolated.fakes
    fakes["request_receiver"].returns["recv_requests"] = []
    assert scheduler.step() is False  # nothing to run: the host goes idle
    assert fakes["metrics_reporter"].calls == [("maybe_log_idle_metrics", (), {})]
    assert fakes["kv_events_publisher"].calls == [("publish_kv_events", (), {})]
    assert fakes["model_runner"].calls == []


def test_a_finished_decode_request_goes_back_to_the_cache_fake():
    isolated = isolate("batch_result_processor", WIRING)
    processor, fakes = isolated.component, isolated.fakes
    assert set(fakes) == {
        "tree_cache",
        "output_streamer",
        "model_runner",
        "metrics_reporter",
        "scheduler",
    }
    fakes["model_runner"].returns["now"] = 2.5
    node = object()
    done = Req(
        rid="done", origin_input_ids=[1, 2], sampling_params=SamplingParams(max_new_tokens=1)
    )
    done.kv_indices, done.last_node = [10, 11], node
    batch = ScheduleBatch(reqs=[done], forward_mode=ForwardMode.DECODE)
    processor.process_batch_result(batch, GenerationBatchResult(next_token_ids=[7]))
    assert done.finished_reason == FinishLength(1) and done.finish_time == 2.5
    assert fakes["tree_cache"].calls == [("cache_finished_req", (done,), {})]
    assert [c.name for c in fakes["metrics_reporter"].calls] == [
        "increment_generated_tokens",
        "advance_forward_ct_decode",
        "report_decode_stats",
    ]
    assert fakes["metrics_reporter"].calls_to("increment_generated_tokens")[0].args == (1,)
    assert fakes["output_streamer"].calls_to("stream_output")[0].arguments["reqs"] == [done]


def test_neighbours_and_overrides_replace_fakes_and_arguments():
    allocator = TokenToKVPoolAllocator(size=64, page_size=1)
    cache = RadixCache(allocator=allocator, page_size=1)
    isolated = isolate(
        "load_inquirer",
        WIRING,
        neighbours={"allocator": allocator, "tree_cache": cache},
    )
    inquirer, fakes = isolated.component, isolated.fakes
    assert fakes["allocator"] is allocator and set(fakes) >= {"scheduler", "metrics_reporter"}
    allocator.alloc(16)
    # get_waiting_queue is !late scheduler.waiting_queue: it reads the fake's field each time
    fakes["scheduler"].waiting_queue.append(Req(rid="w", origin_input_ids=[1, 2, 3]))
    loads = inquirer.get_loads()
    assert loads["num_used_tokens"] == 16 and loads["num_waiting_reqs"] == 1
    assert loads["num_total_tokens"] == 19

    runner = SimulatedModelRunner(zero_cost=True)
    scheduler = isolate("scheduler", WIRING, model_runner=runner).component
    assert scheduler.model_runner is runner


def test_isolating_with_an_overlay_and_a_loaded_wiring(tmp_path):
    overlay = tmp_path / "fcfs.yaml"
    overlay.write_text("components:\n  policy:\n    type: fcfs\n    args: {tree_cache: null}\n")
    isolated = isolate("scheduler", WIRING, overlays=[overlay])
    assert type(isolated.fakes["policy"]).__name__ == "FakeFCFSPolicy"
    wiring = load_wiring(WIRING)
    assert isinstance(isolate("metrics_reporter", wiring).component, MetricsReporter)


def test_bad_requests_are_named():
    with pytest.raises(
        WiringError, match="no component 'sheduler' in the wiring; components: parallel"
    ):
        isolate("sheduler", WIRING)
    with pytest.raises(TypeError, match="Scheduler has no argument 'max_running'; valid"):
        isolate("scheduler", WIRING, max_running=3)
    with pytest.raises(WiringError, match="neighbours output_sender are not referenced"):
        isolate("scheduler", WIRING, neighbours={"output_sender": object()})


def test_isolate_outside_a_checkout_uses_the_shipped_wiring(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with isolate("load_inquirer") as isolated:
        assert isolated.component.allocator.size == 65536
        assert set(isolated.fakes) >= {"allocator", "tree_cache", "scheduler"}
