"""The default wiring's scheduler built in plain Python (events and streaming off): keyword
arguments, and lambdas for what ``wiring.yaml`` binds late. ``bench_scheduler.py`` runs it
against the YAML-built scheduler."""

from __future__ import annotations

from typing import Any

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.io.kv_events_publisher import KvEventsPublisher
from schedkit.components.io.output_streamer import OutputStreamer
from schedkit.components.io.request_receiver import InprocRequestReceiver
from schedkit.components.metrics.reporter import MetricsReporter
from schedkit.components.scheduler.batch_result_processor import BatchResultProcessor
from schedkit.components.scheduler.load_inquirer import LoadInquirer
from schedkit.components.scheduler.schedule_policy import LPMPolicy
from schedkit.components.scheduler.scheduler import Scheduler
from schedkit.core.parallel_state import ParallelState
from schedkit.runner.model_runner import SimulatedModelRunner

__all__ = ["DroppingSender", "hand_built"]


class DroppingSender:
    """An output sender that drops every message (streaming "off")."""

    def send(self, msg: object) -> None:
        """Drop ``msg``."""

    def close(self) -> None:
        """Nothing to close."""


def hand_built() -> dict[str, Any]:
    """The components of the default wiring (events and streaming off), built in plain Python:
    keyword arguments, and lambdas for what the wiring binds late."""
    parallel_state = ParallelState()
    allocator = TokenToKVPoolAllocator(size=65536, page_size=16)
    tree_cache = RadixCache(allocator=allocator, page_size=16, enable_kv_cache_events=False)
    policy = LPMPolicy(tree_cache=tree_cache)
    model_runner = SimulatedModelRunner(seed=0, clock="virtual", zero_cost=True)
    request_receiver = InprocRequestReceiver()
    output_sender = DroppingSender()
    scheduler: Scheduler | None = None
    metrics_reporter: MetricsReporter | None = None
    load_inquirer: LoadInquirer | None = None
    kv_events_publisher = KvEventsPublisher(
        kv_events_config=None,
        parallel_state=parallel_state,
        tree_cache=tree_cache,
        max_running_requests=256,
        max_total_num_tokens=allocator.size,
        page_size=allocator.page_size,
        get_stats=lambda: metrics_reporter.stats,
    )
    output_streamer = OutputStreamer(
        sender=output_sender,
        tree_cache=tree_cache,
        parallel_state=parallel_state,
        stream_interval=1,
        get_load=lambda: load_inquirer.get_loads(),
    )
    batch_result_processor = BatchResultProcessor(
        tree_cache=tree_cache,
        output_streamer=output_streamer,
        eos_token_id=model_runner.eos_token_id,
        now=lambda: model_runner.now(),
        report_prefill_stats=lambda batch: metrics_reporter.report_prefill_stats(batch),
        report_decode_stats=lambda batch: metrics_reporter.report_decode_stats(batch),
        increment_generated_tokens=lambda n: metrics_reporter.increment_generated_tokens(n),
        advance_forward_ct_decode=lambda: metrics_reporter.advance_forward_ct_decode(),
        abort_request=lambda rid: scheduler.abort_request(rid),
    )
    load_inquirer = LoadInquirer(
        allocator=allocator,
        tree_cache=tree_cache,
        parallel_state=parallel_state,
        get_running_batch=lambda: scheduler.running_batch,
        get_waiting_queue=lambda: scheduler.waiting_queue,
        get_chunked_req=lambda: scheduler.chunked_req,
        get_stats=lambda: metrics_reporter.stats,
    )
    metrics_reporter = MetricsReporter(
        load_inquirer=load_inquirer,
        emit_kv_metrics=lambda: kv_events_publisher.emit_kv_metrics(),
        publish_kv_events=lambda: kv_events_publisher.publish_kv_events(),
        now=lambda: model_runner.now(),
        decode_log_interval=40,
        enable_metrics=False,
        log_format="console",
    )
    scheduler = Scheduler(
        request_receiver=request_receiver,
        allocator=allocator,
        tree_cache=tree_cache,
        policy=policy,
        model_runner=model_runner,
        batch_result_processor=batch_result_processor,
        now=lambda: model_runner.now(),
        publish_kv_events=lambda: kv_events_publisher.publish_kv_events(),
        maybe_log_idle_metrics=lambda: metrics_reporter.maybe_log_idle_metrics(),
        on_pause=lambda: metrics_reporter.on_pause(),
        get_loads=lambda: load_inquirer.get_loads(),
        on_finish=lambda req: metrics_reporter.observe_finished_request(req),
        max_running_requests=256,
        max_prefill_tokens=16384,
        chunked_prefill_size=8192,
    )
    return {"scheduler": scheduler, "metrics_reporter": metrics_reporter}
