"""The scheduler host loop, after SGLang's ``Scheduler.event_loop_normal``.

(Longer than 300 lines: the loop and the request lifecycle it drives, submit, abort, pause,
continue and flush, read best in one place; batch forming is in ``prefill_adder`` and
``decode_batch``.)

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
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable, Hashable
from operator import attrgetter
from typing import Any, Literal

import attrs
import structlog

from schedkit.components.io.io_struct import ControlReply
from schedkit.components.scheduler.batching import (
    KVSlots,
    NewTokenRatio,
    PrefillAdder,
    retract_decode,
    take_decode_slots,
)
from schedkit.components.scheduler.client_share import ClientShare
from schedkit.components.scheduler.waiting_queue import WaitingQueue
from schedkit.core.component import ArgumentError, at_least, component
from schedkit.core.protocols import (
    BatchResultProcessor,
    DecodeStepCounter,
    KVAllocator,
    ModelRunner,
    PrefixCache,
    RequestReceiver,
    SchedulePolicy,
)
from schedkit.core.schedule_batch import MAX_TOKEN_ID, FinishAbort, ForwardMode, Req, ScheduleBatch

__all__ = ["Scheduler"]

log = structlog.get_logger(__name__)

_FINISHED_REASON = attrgetter("finished_reason")


def _noop() -> None:
    return None


def _ignore(_req: Req) -> None:
    return None


@component("scheduler")
class Scheduler:
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
    _kv: KVSlots = attrs.field(init=False, repr=False)
    _ratio: NewTokenRatio = attrs.field(init=False, repr=False)
    # Set when admission failed for lack of KV room; cleared when a request leaves or arrives.
    _prefill_blocked: bool = attrs.field(init=False, default=False)
    _client_share: ClientShare | None = attrs.field(init=False, default=None, repr=False)
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

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)
        self._page_size = self.allocator.page_size
        self._ratio = NewTokenRatio.conservative(
            self.init_new_token_ratio,
            self.min_new_token_ratio,
            self.new_token_ratio_decay_steps,
            self.schedule_conservativeness,
        )
        self._kv = KVSlots(self.allocator, self.tree_cache, self._page_size)
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

    def run_decode_steps(
        self, max_steps: int, until: float, origin: float, counter: DecodeStepCounter
    ) -> tuple[list[float], list[tuple[int, int]]] | None:
        """Up to ``max_steps`` loop iterations at once, when each would only run the
        unchanging decode batch: nothing arrives, no prefill can be formed, no request
        finishes, the pages they need are free without evicting, each step starts before
        ``until`` seconds after ``origin`` on the model runner's clock and none is a step
        ``counter`` (the metrics reporter) reports at but the last. Every figure is what as
        many ``step`` calls give: tokens, token times, KV slots, the new-token ratio, streamed
        messages, counters. Returns each step's end time on the runner's clock and the steps
        (counted from 0) that took new KV pages with the slots each took; None, with nothing
        run, when the next iteration is not such a step (``step`` runs it). Needs a model
        runner with ``forward_decode_run``, a batch result processor with
        ``process_decode_run`` and pages of more than one slot."""
        forward_run, pages = self._forward_decode_run, self._kv.decode_pages
        if forward_run is None or pages is None:
            return None
        received = self.request_receiver.recv_requests()
        if received:
            self._take_received(received)  # what step() does first; it runs the rest
            return None
        reqs = self.running_batch.reqs
        if (
            self.paused
            or not reqs
            or self.chunked_req is not None
            or (
                self.waiting_queue
                and not self._prefill_blocked
                # a client share may retract running requests for a waiting one
                and (len(reqs) < self.max_running_requests or self._client_share is not None)
            )
        ):
            return None
        processor = self.batch_result_processor
        limit = min(max_steps, counter.decode_steps_to_report())
        limit = processor.decode_run_steps(reqs, limit, self.model_runner.now())
        if limit > 0:
            limit = pages.steps_in_pool(reqs, limit)
        if limit <= 0:
            return None
        eos = getattr(processor, "eos_token_id", None)
        times, tokens = forward_run(reqs, limit, until, origin, eos)
        if not times:
            return None
        steps = len(times)
        taken = pages.take_run(reqs, steps)
        self._ratio.decay_run(steps)
        processor.process_decode_run(self.running_batch, tokens, times, counter)
        return times, taken

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

    # ---- requests ----------------------------------------------------------------------

    def submit(self, req: Req) -> None:
        """Queue a request, or finish it at once with FinishAbort if it is invalid or can
        never fit in the KV pool."""
        error = req.sampling_params.validation_error()
        ids = req.origin_input_ids
        if error is None and not ids:
            error = "input_ids is empty; a request needs at least one prompt token"
        packed = isinstance(ids, array) and ids.typecode == "I"  # in range by construction
        if error is None and not packed and (min(ids) < 0 or max(ids) > MAX_TOKEN_ID):
            error = f"input_ids must be token ids in [0, {MAX_TOKEN_ID}]"
        if error is None:
            prompt, new = len(req.origin_input_ids), req.sampling_params.max_new_tokens
            if -(-(prompt + new) // self._page_size) * self._page_size > self.allocator.size:
                error = (
                    f"prompt ({prompt} tokens) + max_new_tokens ({new}) = {prompt + new} "
                    f"tokens can never fit in the KV pool of {self.allocator.size} tokens"
                )
        if error is not None:
            self._finish_aborted(req, error)
            return
        if not req.arrival_time:
            req.arrival_time = self.now()
        req.wait_queue_entry_time = self.now()
        req.arrival_processed_tokens = self.processed_prefill_tokens
        self.waiting_queue.append(req)
        self._prefill_blocked = False

    def _submit_guarded(self, req: Req) -> None:
        # One request must never take the loop down: whatever submit raises finishes it.
        try:
            self.submit(req)
        except Exception as exc:
            log.exception("request failed on arrival", rid=req.rid)
            if req.finished_reason is None:
                self._finish_aborted(req, f"internal error: {type(exc).__name__}: {exc}")

    def abort_request(self, rid: str) -> None:
        """Finish request ``rid`` with FinishAbort wherever it is and release its KV. A running
        request that already finished (aborted while its result was processed) is left for
        the end of the step to remove."""
        for i, req in enumerate(self.waiting_queue):
            if req.rid == rid:
                del self.waiting_queue[i]
                self._finish_aborted(req, "aborted")
                return
        if self.chunked_req is not None and self.chunked_req.rid == rid:
            req, self.chunked_req = self.chunked_req, None
            self._finish_aborted(req, "aborted")
            return
        for req in self.running_batch.reqs:
            if req.rid == rid and req.finished_reason is None:
                # A new list: the batch result processor may be iterating the old one.
                self.running_batch.reqs = [r for r in self.running_batch.reqs if r is not req]
                self._finish_aborted(req, "aborted")
                return

    def requeue_waiting(self, rid: str) -> bool:
        """Move waiting request ``rid`` to the back of the waiting queue (a request edge's
        turn-taking); False if it is not waiting."""
        waiting = self.waiting_queue
        for i, req in enumerate(waiting):
            if req.rid == rid:
                del waiting[i]
                waiting.append(req)
                return True
        return False

    def _finish_aborted(self, req: Req, message: str) -> None:
        req.finished_reason = FinishAbort(message)
        req.is_chunked = False
        self.batch_result_processor.process_aborted([req])
        self._finished(req)

    # ---- control -----------------------------------------------------------------------

    def pause_generation(self, mode: Literal["in_place", "retract"]) -> None:
        """Stop running batches; ``retract`` also sends running requests (and a partly
        prefilled one) back to the waiting queue. Calls ``on_pause`` in every mode."""
        if mode not in ("in_place", "retract"):
            raise ValueError(f"pause mode must be 'in_place' or 'retract', got {mode!r}")
        self.paused = True
        if mode == "retract":
            retracted = self.running_batch.reqs
            if self.chunked_req is not None:
                retracted.append(self.chunked_req)
                self.chunked_req = None
            self.running_batch.reqs = []
            for req in retracted:
                self._retract(req)
            self.waiting_queue.extend(retracted)
        self.on_pause()

    def continue_generation(self) -> None:
        """Resume after ``pause_generation``."""
        self.paused = False

    def flush_cache(self) -> bool:
        """Empty the prefix cache and the KV pool; only when no request is queued or running."""
        if self.waiting_queue or self.running_batch.reqs or self.chunked_req is not None:
            return False
        self.tree_cache.reset()
        self.allocator.clear()
        self._ratio.reset()
        return True

    def _handle_control(self, item: Any) -> None:
        kind = item.type
        try:
            if kind == "pause":
                self.pause_generation(item.mode)
                item.reply(None)
            elif kind == "continue":
                self.continue_generation()
                item.reply(None)
            elif kind == "flush":
                item.reply(self.flush_cache())
            elif kind == "get_loads" and self.get_loads is not None:
                item.reply(self.get_loads())
            elif kind == "abort" and item.rid is not None:
                self.abort_request(item.rid)
                item.reply(None)
            elif kind == "requeue" and item.rid is not None:
                item.reply(self.requeue_waiting(item.rid))
            else:
                raise ValueError(f"unsupported control request {kind!r} on this scheduler")
        except ValueError as exc:
            log.warning("control request failed", type=kind, error=str(exc))
            item.reply(ControlReply(type=str(kind), ok=False, message=str(exc)))

    # ---- batches -----------------------------------------------------------------------

    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        """A prefill batch when one can be formed, else the decode batch, else None."""
        return self.get_new_batch_prefill() or self.update_running_batch()

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        """Continue the chunked request, then admit waiting requests in policy order until
        the first that does not fit (``PrefillAdder``); with ``client_of``, as the clients'
        shares allow (``client_share``)."""
        share, chunked = self._client_share, self.chunked_req
        defer_chunk = False
        if share is not None and (self.waiting_queue or chunked) and not self._prefill_blocked:
            self._retract_for_share(
                share.plan(self.running_batch.reqs, chunked, self.waiting_queue)
            )
            defer_chunk = chunked is not None and share.defers(chunked)
        running = self.running_batch.reqs
        if self._prefill_blocked or (
            chunked is None
            and (not self.waiting_queue or len(running) >= self.max_running_requests)
        ):
            return None
        adder = PrefillAdder(
            self._kv,
            running,
            self._ratio.value,
            self.max_prefill_tokens,
            self.chunked_prefill_size,
            self.max_running_requests,
        )
        if chunked is not None and not defer_chunk and not adder.add_chunked_req(chunked):
            adder.new_chunked_req = chunked  # its next chunk waits for room
        if adder.new_chunked_req is None:
            waiting = self.waiting_queue
            if share is not None:
                admitted = share.admit(adder, waiting, self.policy.calc_priority, defer_chunk)
            else:
                self.policy.calc_priority(waiting)
                admitted = 0
                while admitted < len(waiting) and adder.budget_left():
                    if not adder.add_one_req(waiting[admitted]):
                        break
                    admitted += 1
            if admitted:
                now = self.now()
                for req in waiting[:admitted]:
                    req.wait_queue_exit_time = now
                    if req.scheduled_time is None:
                        req.scheduled_time = now
                del waiting[:admitted]
        if defer_chunk:  # a lighter client's requests go first, unless nothing else can run
            if adder.batch.reqs or running:
                adder.new_chunked_req = chunked  # its next chunk waits
            elif not adder.add_chunked_req(chunked):
                adder.new_chunked_req = chunked  # its next chunk waits for room
        self.chunked_req = adder.new_chunked_req
        if not adder.batch.reqs:
            # Nothing fits until a running request leaves (decoding goes on meanwhile).
            self._prefill_blocked = bool(running)
            return None
        batch = adder.batch
        self.processed_prefill_tokens += sum(batch.extend_lens)
        self.prefill_tokens_computed += sum(batch.extend_lens)
        self.prefill_tokens_cached += sum(batch.cache_hit_lens)
        self.prefill_tokens_cached_host += batch.host_hit_tokens
        return batch

    def update_running_batch(self) -> ScheduleBatch | None:
        """Give every running request one KV slot for its next token, retracting requests
        when the pool is short; the decode batch, or None if nothing runs."""
        batch = self.running_batch
        if not batch.reqs:
            return None
        if take_decode_slots(self._kv, batch.reqs):
            self._ratio.decay()
            return batch
        self._retract_decode()
        if not batch.reqs:
            return None
        take_decode_slots(self._kv, batch.reqs)  # the retraction made room for these
        return batch

    def _retract_decode(self) -> None:
        """Retract running requests (``retract_decode``) and requeue them at the back of the
        waiting queue; a chunked request goes too if that is still not enough, and a last
        request that cannot get one more slot is aborted ("out of memory")."""
        batch, kv = self.running_batch, self._kv
        keep, retracted, need = retract_decode(kv, batch.reqs, self._retract)
        if not kv.ensure_free(need) and self.chunked_req is not None:
            retracted.append(self.chunked_req)
            self._retract(self.chunked_req)
            self.chunked_req = None
        gone = set(retracted)
        if keep and not kv.ensure_free(need):
            last = keep.pop()
            log.error("out of KV memory for the last running request; aborting it", rid=last.rid)
            gone.add(last)
            batch.reqs = [r for r in batch.reqs if r not in gone]
            kv.release(last)
            self._finish_aborted(last, "out of memory: the KV pool cannot hold its next token")
        batch.reqs = [r for r in batch.reqs if r not in gone]
        self.waiting_queue.extend(retracted)
        decoded = sum(len(r.output_ids) for r in keep)
        total = sum(r.sampling_params.max_new_tokens for r in keep)
        self._ratio.after_retract(decoded, len(keep), total)
        log.info("retracted requests", count=len(retracted), new_token_ratio=self._ratio.value)

    def _retract_for_share(self, retract: list[Req]) -> None:
        """Retract running requests of clients over their share (``client_share``) to the back
        of the waiting queue."""
        if not retract:
            return
        gone = set(retract)
        self.running_batch.reqs = [r for r in self.running_batch.reqs if r not in gone]
        for req in retract:
            self._retract(req)
        self.waiting_queue.extend(retract)
        log.info("retracted requests over their client's share", count=len(retract))

    def _retract(self, req: Req) -> None:
        self._kv.release(req)
        req.reset_for_retract()
        req.wait_queue_entry_time = self.now()
        self.num_retracted += 1
        self._prefill_blocked = False
