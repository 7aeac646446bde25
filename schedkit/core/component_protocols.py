"""Whole components: everything the rest of an assembly (other components' ``!ref`` /
``!late`` / ``!call`` bindings, the run driver, the run summary, the CLI) uses of the component
under a wiring key. ``COMPONENT_PROTOCOLS`` maps each wiring key to its protocol; ``schedkit
validate`` checks the class a wiring puts under that key against it and names every missing
member. What one component needs of another is in ``edge_protocols``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from schedkit.core.edge_protocols import (
    BatchResultProcessor,
    KVAllocator,
    LoadInquirer,
    ModelRunner,
    OutputSender,
    OutputStreamer,
    PrefixCache,
    RequestReceiver,
    SchedulePolicy,
)
from schedkit.core.schedule_batch import Req, ScheduleBatch

__all__ = [
    "COMPONENT_PROTOCOLS",
    "DecodeStepCounter",
    "KVEventsPublisherComponent",
    "LoadInquirerComponent",
    "MetricsReporterComponent",
    "ModelRunnerComponent",
    "SchedulerComponent",
    "SchedulerStats",
]


class SchedulerStats(Protocol):
    """The figures the metrics reporter keeps current; read through ``get_stats``."""

    gen_throughput: float
    cache_hit_rate: float


class MetricsReporterComponent(Protocol):
    """Throughput, cache-hit and pool figures: logged, exported, and read by others.

    Wiring key ``metrics_reporter``; default ``metrics_reporter``
    (``components/metrics/reporter.py``). Called by the batch result processor after each
    prefill batch (``report_prefill_stats``) and decode step (``increment_generated_tokens``,
    ``advance_forward_ct_decode``, ``report_decode_stats``), by the scheduler when idle
    (``maybe_log_idle_metrics``), at the end of a pause (``on_pause``) and once per finished
    request (``observe_finished_request``). ``stats`` is read late by the load inquirer and
    the KV-events publisher (``get_stats``). The shipped reporter also flushes the KV events
    (its ``publish_kv_events``) after each prefill report and every ``decode_log_interval``-th
    decode report, as SGLang's does; a reporter that does not leaves them to the scheduler's
    idle flush (the same events in fewer, larger batches). The run summary reads nothing of
    it: its figures come from the scheduler and the requests, so any reporter leaves them true.
    """

    stats: SchedulerStats

    def report_prefill_stats(self, batch: ScheduleBatch) -> None: ...
    def report_decode_stats(self, batch: ScheduleBatch) -> None: ...
    def increment_generated_tokens(self, n: int) -> None: ...
    def advance_forward_ct_decode(self) -> None: ...
    def maybe_log_idle_metrics(self) -> None: ...
    def on_pause(self) -> None: ...
    def observe_finished_request(self, req: Req) -> None: ...


class DecodeStepCounter(Protocol):
    """Counts a run of decode steps at once (the shipped metrics reporter does): a scheduler
    advancing an unchanging decode batch several steps in one call ends the run at the step
    that reports (``decode_steps_to_report``) and counts the steps, ending at ``times``, and
    their tokens in one call."""

    def decode_steps_to_report(self) -> int: ...
    def advance_decode_run(self, times: Sequence[float], batch_size: int) -> None: ...


class LoadInquirerComponent(LoadInquirer, Protocol):
    """How busy the scheduler is: the load snapshot and the pool figures.

    Wiring key ``load_inquirer``; default ``load_inquirer``
    (``components/scheduler/load_inquirer.py``). ``get_loads(include=("core",))`` answers the
    ``get_loads`` control request (through the scheduler's ``get_loads``) and is attached to
    output messages (the output streamer's ``get_load``); it returns a dict with at least
    ``num_running_reqs``, ``num_waiting_reqs``, ``num_used_tokens``, ``token_usage``,
    ``num_total_tokens``, ``num_waiting_uncached_tokens``, ``gen_throughput``,
    ``cache_hit_rate`` and ``dp_rank``. The metrics reporter reads the members of
    ``LoadInquirer`` (``allocator``, ``get_running_batch``, ``get_waiting_queue``,
    ``num_used_tokens``).
    """

    def get_loads(self, include: Any = ("core",)) -> dict[str, Any]: ...


class KVEventsPublisherComponent(Protocol):
    """Sends the prefix cache's KV events (and KV metrics) out of the scheduler.

    Wiring key ``kv_events_publisher``; default ``kv_events_publisher``
    (``components/io/kv_events_publisher.py``). ``publish_kv_events()`` drains the cache's
    pending events into one batch (the scheduler after each step, the metrics reporter after
    its reports, the run driver at the end of a run); ``emit_kv_metrics()`` sends the current
    load figures. The run summary reads ``accepted`` and ``dropped`` (event batches).
    """

    accepted: int
    dropped: int

    def publish_kv_events(self) -> None: ...
    def emit_kv_metrics(self) -> None: ...


class ModelRunnerComponent(ModelRunner, Protocol):
    """The model: a batch in, its next tokens out, on the clock the whole assembly reads.

    Wiring key ``model_runner``; default ``simulated_model_runner``
    (``schedkit/runner/model_runner.py``). ``forward`` and ``now`` as in ``ModelRunner``;
    ``wait_until(t)`` lets the clock reach ``t`` with nothing to run (a virtual clock jumps, a
    wall clock sleeps; the run driver calls it between arrivals); ``eos_token_id`` (None: no
    end-of-sequence token) is what the batch result processor finishes requests on.
    """

    eos_token_id: int | None

    def wait_until(self, t: float) -> None: ...


class SchedulerComponent(Protocol):
    """The host loop: takes requests, forms and runs batches, finishes requests.

    Wiring key ``scheduler``; default ``scheduler`` (``components/scheduler/scheduler.py``).
    ``submit(req)`` queues a request, ``step()`` runs one loop iteration (True when a batch
    ran), ``serve(stop)`` steps until the event is set, ``abort_request(rid)`` aborts one
    (the batch result processor's ``abort_request``). ``on_finish(req)`` is called once per
    finished request (the run driver chains onto it). The run driver samples
    ``running_batch`` and ``waiting_queue`` each step; the load inquirer reads them and
    ``chunked_req`` late. The run summary reads ``peak_running_requests``, ``num_retracted``,
    ``prefill_tokens_computed`` and ``prefill_tokens_cached`` (the prefix-cache hit rate is
    cached / (cached + computed) over every prefill batch, as SGLang logs it).
    """

    running_batch: ScheduleBatch
    waiting_queue: Sequence[Req]
    chunked_req: Req | None
    paused: bool
    on_finish: Callable[[Req], None]
    max_running_requests: int
    peak_running_requests: int
    num_retracted: int
    prefill_tokens_computed: int
    prefill_tokens_cached: int

    def submit(self, req: Req) -> None: ...
    def step(self) -> bool: ...
    def serve(self, stop: Any) -> None: ...
    def abort_request(self, rid: str) -> None: ...


COMPONENT_PROTOCOLS: dict[str, type] = {
    "allocator": KVAllocator,
    "tree_cache": PrefixCache,
    "policy": SchedulePolicy,
    "request_receiver": RequestReceiver,
    "output_sender": OutputSender,
    "model_runner": ModelRunnerComponent,
    "output_streamer": OutputStreamer,
    "batch_result_processor": BatchResultProcessor,
    "load_inquirer": LoadInquirerComponent,
    "metrics_reporter": MetricsReporterComponent,
    "kv_events_publisher": KVEventsPublisherComponent,
    "scheduler": SchedulerComponent,
}
"""Wiring key -> the protocol of the component under it (see the module docstring)."""
