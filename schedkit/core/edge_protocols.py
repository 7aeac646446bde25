"""The edges of a scheduler: what one component needs of a component it is wired to.

Each component annotates its collaborator fields with these protocols; ``schedkit validate``
checks that the component an eager ``!ref`` names has every member of the field's protocol.
``schedkit.core.protocols`` names them all, with the order a step runs through them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from schedkit.core.schedule_batch import GenerationBatchResult, Req, ScheduleBatch

__all__ = [
    "BatchResultProcessor",
    "Clock",
    "KVAllocator",
    "LoadInquirer",
    "ModelRunner",
    "OutputSender",
    "OutputStreamer",
    "PrefixCache",
    "RequestReceiver",
    "SchedulePolicy",
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
