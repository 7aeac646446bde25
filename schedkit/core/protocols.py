"""The seams of a scheduler: what each component needs of the components it is wired to.

A scheduler step runs through these seams in order (docs/architecture.md follows a request
through them with the file and function of each hop):

1. ``RequestReceiver.recv_requests`` hands the scheduler what arrived since the last step.
2. ``SchedulePolicy.calc_priority`` orders the waiting queue; admission matches, locks and
   fills ``PrefixCache`` entries and takes slots from the ``KVAllocator``.
3. ``ModelRunner.forward`` runs the batch and returns its next tokens, on its own ``Clock``.
4. ``BatchResultProcessor.process_batch_result`` applies the tokens: it appends them, finishes
   requests, caches their KV (``PrefixCache.cache_finished_req``/``cache_unfinished_req``)
   and asks the ``OutputStreamer`` to stream what is due.
5. ``OutputStreamer.stream_output`` packs one message per step for the ``OutputSender``.
6. Around the step, the metrics reporter reads pool and queue figures from a ``LoadInquirer``.

Each component annotates its collaborator fields with these protocols. ``schedkit validate``
checks that the component an eager ``!ref`` names has every member of the field's protocol,
so a wrong or incompatible component is reported at its file and line before anything is
built. Any class with the members fits: a fake in a test inherits from nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from schedkit.core.schedule_batch import GenerationBatchResult, Req, ScheduleBatch

__all__ = [
    "COMPONENT_PROTOCOLS",
    "BatchResultProcessor",
    "Clock",
    "DecodeStepCounter",
    "KVAllocator",
    "KVEventsPublisherComponent",
    "LoadInquirer",
    "LoadInquirerComponent",
    "MetricsReporterComponent",
    "ModelRunner",
    "ModelRunnerComponent",
    "OutputSender",
    "OutputStreamer",
    "PrefixCache",
    "RequestReceiver",
    "SchedulePolicy",
    "SchedulerComponent",
    "SchedulerStats",
]


class KVAllocator(Protocol):
    """A pool of KV-cache slots handed out a page at a time.

    Wiring key ``allocator``; default ``token_to_kv_pool_allocator``
    (``components/cache/allocator.py``). ``size`` slots in all, ``page_size`` slots a page;
    ``alloc(n)`` returns ``n`` slots (whole pages) or None when the pool is short.
    """

    size: int
    page_size: int

    def alloc(self, n: int) -> list[int] | None: ...
    def free(self, indices: Sequence[int]) -> None: ...
    def available_size(self) -> int: ...


class PrefixCache(Protocol):
    """A prefix cache the scheduler matches, locks, fills and evicts (radix or SWA).

    Wiring key ``tree_cache``; default ``radix_cache`` (``components/cache/radix_cache.py``),
    or ``swa_radix_cache``. ``match_prefix`` returns the cached slots of a key's longest
    cached prefix and the node ending it; ``inc_lock_ref(node)`` protects that path from
    eviction and returns a token that ``dec_lock_ref(node, token)`` takes back. A request's KV
    goes back through ``cache_finished_req`` (insert, unlock, free what the cache does not
    keep) or, after a prefill chunk, ``cache_unfinished_req`` (insert and re-lock).
    ``take_events`` drains the KV-cache events recorded since the last call.
    """

    page_size: int
    disable: bool

    def match_prefix(self, key: Sequence[int]) -> Any: ...
    def insert(self, key: Sequence[int], value: Sequence[int] | None = None) -> int: ...
    def inc_lock_ref(self, node: Any) -> Any: ...
    def dec_lock_ref(self, node: Any, swa_uuid_for_lock: Any = None) -> Any: ...
    def evict(self, num_tokens: int) -> Any: ...
    def evictable_size(self) -> int: ...
    def protected_size(self) -> int: ...
    def total_size(self) -> int: ...
    def reset(self) -> None: ...
    def take_events(self) -> list: ...
    def cache_finished_req(self, req: Req) -> None: ...
    def cache_unfinished_req(self, req: Req) -> None: ...


class SchedulePolicy(Protocol):
    """The order in which waiting requests are considered for the next prefill batch.

    Wiring key ``policy``; defaults ``lpm``, ``fcfs``, ``priority``
    (``components/scheduler/schedule_policy.py``). ``calc_priority`` sorts the waiting queue
    in place, first to be admitted first; admission stops at the first request that does not
    fit, as in SGLang.
    """

    def calc_priority(self, waiting_queue: list[Req]) -> None: ...


class RequestReceiver(Protocol):
    """Where new requests and control requests come from; never blocks.

    Wiring key ``request_receiver``; defaults ``inproc_request_receiver``
    (``components/io/request_receiver.py``) and ``zmq_server`` (``components/io/zmq_server.py``).
    """

    def recv_requests(self) -> list: ...


class Clock(Protocol):
    """The scheduler's time: virtual or wall seconds."""

    def now(self) -> float: ...


class ModelRunner(Clock, Protocol):
    """Runs one batch and returns its next tokens; owns the clock the scheduler reads.

    Wiring key ``model_runner``; default ``simulated_model_runner``
    (``schedkit/runner/model_runner.py``), which advances a virtual clock by a cost model.
    """

    def forward(self, batch: ScheduleBatch) -> GenerationBatchResult: ...


class BatchResultProcessor(Protocol):
    """Applies a forward pass's tokens to its batch, after SGLang's
    ``SchedulerOutputProcessorMixin``.

    Wiring key ``scheduler.batch_result_processor``; default ``batch_result_processor``
    (``components/scheduler/batch_result_processor.py``). ``process_batch_result`` appends the
    tokens, finishes requests (length, stop token, abort), hands their KV back to the prefix
    cache and streams what is due; ``process_aborted`` finishes requests the scheduler dropped
    before they ran, so that each still gets its final output.
    """

    def process_batch_result(self, batch: ScheduleBatch, result: GenerationBatchResult) -> None: ...
    def process_aborted(self, reqs: list[Req]) -> None: ...


class OutputStreamer(Protocol):
    """Turns a step's requests into one output message, after SGLang's ``stream_output``.

    Wiring key ``batch_result_processor.output_streamer``; default ``output_streamer``
    (``components/io/output_streamer.py``). ``stream_output`` sends what is due for ``reqs``
    (new tokens every ``stream_interval`` steps, the final output once), except ``skip_req``;
    ``is_idle_batch`` marks an empty step that must still report under DP attention.
    """

    def stream_output(
        self,
        reqs: list[Req],
        return_logprob: bool = False,
        skip_req: Req | None = None,
        is_idle_batch: bool = False,
    ) -> None: ...


class OutputSender(Protocol):
    """Where the output streamer's batch messages go.

    Wiring key ``output_streamer.sender``; defaults ``output_tally`` (encode and count),
    ``inproc_output_collector``, ``zmq_output_sender`` and ``zmq_server``
    (``components/io/output_sender.py``, ``components/io/zmq_server.py``).
    """

    def send(self, msg: Any) -> None: ...


class LoadInquirer(Protocol):
    """The pool and queue figures the metrics reporter fills its stats from.

    Wiring key ``metrics_reporter.load_inquirer``; default ``load_inquirer``
    (``components/scheduler/load_inquirer.py``), which also answers ``get_loads`` for load
    reports. ``get_running_batch`` and ``get_waiting_queue`` are bound late to the scheduler.
    """

    allocator: KVAllocator
    get_running_batch: Callable[[], ScheduleBatch]
    get_waiting_queue: Callable[[], Sequence[Req]]

    def num_used_tokens(self) -> int: ...


# ---- Whole components ---------------------------------------------------------------------
#
# The protocols above are edges: what one component needs of another. The ones below are whole
# components: everything the rest of an assembly (other components' !ref / !late / !call
# bindings, the run driver, the run summary, the CLI) uses of the component under a wiring key.
# ``COMPONENT_PROTOCOLS`` maps each wiring key to its protocol; ``schedkit validate`` checks the
# class a wiring puts under that key against it and names every missing member.


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
    that reports and counts the steps and their tokens in one call."""

    def decode_steps_to_report(self) -> int: ...
    def advance_decode_run(self, steps: int, tokens: int) -> None: ...


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
"""Wiring key -> the protocol of the component under it (see the section comment above)."""
