"""The scheduler host loop, after SGLang's ``Scheduler.event_loop_normal``.

Each ``step()``: take new requests and control requests from the receiver; stop there while
paused; otherwise form the next batch (prefill first, else decode), run it on the model runner
and hand the result to the batch result processor, or run ``on_idle()`` when there is nothing
to do.

KV memory: a request holds one KV slot per token that has KV (``req.kv_indices``, the cached
prefix first, locked in the prefix cache through ``req.last_node``). Prefill admission keeps
room for the running requests' future tokens, estimated as ``new_token_ratio`` times their
remaining tokens; the ratio decays while decoding goes well. When a decode step finds too few
free slots even after evicting from the cache, running requests are retracted as in SGLang
(fewest output tokens first, finished ones never): the KV they computed is freed, their cached
prefix unlocked, they join the back of the waiting queue keeping their output, and the ratio
rises so that fewer requests are admitted. A last request that still cannot get a slot is
aborted ("out of memory").

The request lifecycle (submit, abort, requeue) and control (pause, continue, flush) are in
``scheduler_requests``; forming the next batch and retracting in ``scheduler_batches``, on top
of ``prefill_adder``'s admission and ``decode_slots``; several decode steps of an unchanging
batch in one call in ``scheduler_decode_runs``. All three are mixed into ``Scheduler``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from operator import attrgetter
from typing import Any

import attrs

from schedkit.components.scheduler.client_share import ClientShare
from schedkit.components.scheduler.kv_slots import KVSlots
from schedkit.components.scheduler.new_token_ratio import NewTokenRatio
from schedkit.components.scheduler.prefill_step_bound import PrefillStepBound
from schedkit.components.scheduler.scheduler_batches import SchedulerBatches
from schedkit.components.scheduler.scheduler_decode_runs import SchedulerDecodeRuns
from schedkit.components.scheduler.scheduler_requests import (
    MIN_CONTEXT_LENGTH,
    SchedulerRequests,
)
from schedkit.components.scheduler.waiting_queue import WaitingQueue
from schedkit.core.component import ArgumentError, at_least, component
from schedkit.core.protocols import (
    BatchResultProcessor,
    KVAllocator,
    ModelRunner,
    PrefixCache,
    RequestReceiver,
    SchedulePolicy,
)
from schedkit.core.schedule_batch import ForwardMode, Req, ScheduleBatch

__all__ = ["Scheduler"]


_FINISHED_REASON = attrgetter("finished_reason")


def _noop() -> None:
    return None


def _ignore(_req: Req) -> None:
    return None


@component("scheduler")
class Scheduler(SchedulerRequests, SchedulerBatches, SchedulerDecodeRuns):
    """Admits, batches, runs and retracts requests; see the module docstring.

    ``chunked_prefill_size`` None disables chunking. ``now`` stamps arrival times. The
    callbacks (``publish_kv_events``, ``maybe_log_idle_metrics``, ``on_pause``, ``get_loads``)
    are bound late to the KV-events publisher, metrics reporter and load inquirer.
    ``on_finish(req)`` is called once for every request that finishes (done, refused or
    aborted), after its final output went out. The waiting queue is a ``WaitingQueue``: it
    keeps the waiting-token totals that ``get_loads`` reports. ``prefill_tokens_computed``
    and ``prefill_tokens_cached`` count the prompt tokens of every prefill batch (a chunk's
    own earlier chunks are computed, not cached): the prefix-cache hit rate of a run;
    ``prefill_tokens_cached_host`` is the part of the cached tokens loaded back from a host tier.
    """

    request_receiver: RequestReceiver
    allocator: KVAllocator
    tree_cache: PrefixCache
    policy: SchedulePolicy
    model_runner: ModelRunner
    batch_result_processor: BatchResultProcessor
    now: Callable[[], float] = time.monotonic
    publish_kv_events: Callable[[], None] = _noop
    maybe_log_idle_metrics: Callable[[], None] = _noop
    on_pause: Callable[[], None] = _noop
    get_loads: Callable[[], dict] | None = None
    on_finish: Callable[[Req], None] = _ignore
    max_running_requests: int = attrs.field(default=256, validator=at_least(1))
    max_prefill_tokens: int = attrs.field(default=16384, validator=at_least(1))
    chunked_prefill_size: int | None = 8192
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.098
    new_token_ratio_decay_steps: int = attrs.field(default=600, validator=at_least(1))
    # SGLang's --schedule-conservativeness: scales the initial new-token ratio (capped at 1)
    # and the minimum with it (their ratio kept, capped at 1).
    schedule_conservativeness: float = 1.0
    sleep_on_idle_seconds: float = 0.001
    # Who sent a request (a request edge's ``client_of``): set, the running batch is shared
    # fairly between clients, ``client_share_tokens`` of context split between them
    # (``client_share``); None keeps SGLang's behaviour.
    client_of: Callable[[Req], Hashable] | None = None
    client_share_tokens: int = attrs.field(default=65536, validator=at_least(1))
    # A prefill step's modelled time: both set, a prefill batch takes at most the fresh
    # tokens whose ``prefill_seconds(tokens, prefix)`` at its deepest prefix is within
    # ``max_prefill_step_seconds`` (``prefill_step_bound``); None keeps SGLang's token bounds.
    max_prefill_step_seconds: float | None = None
    prefill_seconds: Callable[[int, int], float] | None = None
    # The model's limits, applied on arrival as SGLang does (``scheduler_requests``):
    # ``context_length`` (SGLang's ``context_len``) refuses a prompt of ``max_req_input_len``
    # tokens or more, or cuts it to that with ``allow_auto_truncate``, and clips max_new_tokens
    # to what the context leaves; ``vocab_size`` refuses token ids at or above it. None: no
    # such limit (only the KV pool bounds a request).
    context_length: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(at_least(MIN_CONTEXT_LENGTH))
    )
    vocab_size: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(at_least(1))
    )
    allow_auto_truncate: bool = False

    waiting_queue: WaitingQueue = attrs.field(init=False, factory=WaitingQueue)
    running_batch: ScheduleBatch = attrs.field(
        init=False, factory=lambda: ScheduleBatch(reqs=[], forward_mode=ForwardMode.DECODE)
    )
    chunked_req: Req | None = attrs.field(init=False, default=None)
    paused: bool = attrs.field(init=False, default=False)
    peak_running_requests: int = attrs.field(init=False, default=0)
    num_retracted: int = attrs.field(init=False, default=0)
    # Prefill tokens scheduled so far (SGLang's processed-tokens counter for HRRN).
    processed_prefill_tokens: int = attrs.field(init=False, default=0)
    # Prompt tokens of every prefill batch: computed, and served from the prefix cache.
    prefill_tokens_computed: int = attrs.field(init=False, default=0)
    prefill_tokens_cached: int = attrs.field(init=False, default=0)
    prefill_tokens_cached_host: int = attrs.field(init=False, default=0)
    finished_count: int = attrs.field(init=False, default=0)
    _page_size: int = attrs.field(init=False, default=1)
    # SGLang's max_req_len: min(context_length - 1, KV pool - 1); None without context_length.
    _max_req_len: int | None = attrs.field(init=False, default=None)
    _kv: KVSlots = attrs.field(init=False, repr=False)
    _ratio: NewTokenRatio = attrs.field(init=False, repr=False)
    # Set when admission failed for lack of KV room; cleared when a request leaves or arrives.
    _prefill_blocked: bool = attrs.field(init=False, default=False)
    _client_share: ClientShare | None = attrs.field(init=False, default=None, repr=False)
    _step_bound: PrefillStepBound | None = attrs.field(init=False, default=None, repr=False)
    # The model runner's and batch result processor's decode-run methods, when both have them.
    _forward_decode_run: Callable[..., tuple[list[float], list[list[int]]]] | None = attrs.field(
        init=False, default=None, repr=False
    )

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too)."""
        page_size = args.allocator.page_size
        if args.tree_cache.page_size != page_size:
            raise ArgumentError(
                "tree_cache",
                f"tree_cache.page_size ({args.tree_cache.page_size}) must equal "
                f"allocator.page_size ({page_size})",
            )
        size = args.chunked_prefill_size
        if size is not None and (not isinstance(size, int) or size < page_size):
            raise ArgumentError(
                "chunked_prefill_size",
                "chunked_prefill_size must be None (no chunking) or an integer >= page_size "
                f"({page_size}), got {size!r}",
            )
        step = args.max_prefill_step_seconds
        if step is not None and not (isinstance(step, int | float) and 0 < step < float("inf")):
            raise ArgumentError(
                "max_prefill_step_seconds",
                f"max_prefill_step_seconds must be None or seconds > 0, got {step!r}",
            )
        if (step is None) != (args.prefill_seconds is None):
            raise ArgumentError(
                "max_prefill_step_seconds",
                "max_prefill_step_seconds and prefill_seconds go together (the bound and the "
                "model runner's prefill_seconds to apply it by); set both or neither",
            )
        # Last: the pool size may be known only once the allocator is built.
        context = args.context_length
        if isinstance(context, int) and min(context, args.allocator.size) < MIN_CONTEXT_LENGTH:
            raise ArgumentError(
                "context_length",
                f"context_length ({context}) and the KV pool ({args.allocator.size} tokens) "
                f"must both be >= {MIN_CONTEXT_LENGTH}: a request needs room for a prompt "
                "token and the 5 tokens SGLang keeps back from max_req_input_len",
            )

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)
        self._page_size = self.allocator.page_size
        if self.context_length is not None:
            self._max_req_len = min(self.context_length, self.allocator.size) - 1
        self._ratio = NewTokenRatio.conservative(
            self.init_new_token_ratio,
            self.min_new_token_ratio,
            self.new_token_ratio_decay_steps,
            self.schedule_conservativeness,
        )
        self._kv = KVSlots(self.allocator, self.tree_cache, self._page_size)
        if self.max_prefill_step_seconds is not None and self.prefill_seconds is not None:
            self._step_bound = PrefillStepBound(
                max_seconds=self.max_prefill_step_seconds,
                prefill_seconds=self.prefill_seconds,
                page_size=self._page_size,
                max_tokens=min(self.chunked_prefill_size or self.max_prefill_tokens, 1 << 20),
            )
        if self.client_of is not None:
            self._client_share = ClientShare(
                client_of=self.client_of, share_tokens=self.client_share_tokens
            )
        processor = self.batch_result_processor
        if hasattr(processor, "decode_run_steps") and hasattr(processor, "process_decode_run"):
            self._forward_decode_run = getattr(self.model_runner, "forward_decode_run", None)

    @property
    def new_token_ratio(self) -> float:
        """The share of running requests' remaining output that admission reserves room for."""
        return self._ratio.value

    # ---- the loop ----------------------------------------------------------------------

    def step(self) -> bool:
        """One loop iteration; True if a batch ran."""
        self._take_received(self.request_receiver.recv_requests())
        if self.paused:
            return False
        batch = self.get_next_batch_to_run()
        if batch is None:
            self.on_idle()
            return False
        result = self.model_runner.forward(batch)
        self.batch_result_processor.process_batch_result(batch, result)
        self._after_batch(batch)
        return True

    def _take_received(self, items: list) -> None:
        for item in items:
            if isinstance(item, Req):
                self._submit_guarded(item)
            else:
                self._handle_control(item)

    def run_until_idle(self, max_steps: int | None = None) -> int:
        """Step until a step runs nothing (idle, or paused) or ``max_steps`` batches ran;
        returns the number of batches run."""
        steps = 0
        while (max_steps is None or steps < max_steps) and self.step():
            steps += 1
        return steps

    def serve(self, stop: threading.Event) -> None:
        """Step until ``stop`` is set, waiting on the receiver (or sleeping) while idle."""
        wait = getattr(self.request_receiver, "wait", None) or stop.wait
        while not stop.is_set():
            if not self.step():
                wait(self.sleep_on_idle_seconds)

    def on_idle(self) -> None:
        """Idle housekeeping: idle metrics, KV events, reset the new-token ratio."""
        self.maybe_log_idle_metrics()
        self.publish_kv_events()
        self._ratio.reset()

    def _after_batch(self, batch: ScheduleBatch) -> None:
        """Move prefilled requests into the running batch; drop finished ones."""
        reqs = batch.reqs
        if batch.forward_mode == ForwardMode.EXTEND:
            running = self.running_batch.reqs
            for req in reqs:
                if req.finished_reason is not None:
                    self._finished(req)
                elif req is not self.chunked_req:
                    running.append(req)
            self.peak_running_requests = max(self.peak_running_requests, len(running))
            return
        if any(map(_FINISHED_REASON, reqs)):
            for req in reqs:
                if req.finished_reason is not None:
                    self._finished(req)
            batch.reqs = [req for req in reqs if req.finished_reason is None]

    def _finished(self, req: Req) -> None:
        self.finished_count += 1
        self._prefill_blocked = False
        self.on_finish(req)
