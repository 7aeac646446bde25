"""The scheduler host loop, after SGLang's ``Scheduler.event_loop_normal``.

Each ``step()``: take new requests and control requests from the receiver; stop there while
paused; otherwise form the next batch (prefill first, else decode), run it on the model runner
and hand the result to the batch result processor, or run ``on_idle()`` when there is nothing
to do.

KV memory: a request holds one KV slot per token that has KV (``req.kv_indices``, the cached
prefix first, locked in the prefix cache through ``req.last_node``). Prefill admission keeps
room for the running requests' future tokens, estimated as ``new_token_ratio`` times their
remaining tokens; the ratio decays while decoding goes well. When a decode step finds too few
free slots even after evicting from the cache, running requests are retracted (fewest output
tokens first, as in SGLang): their KV goes into the cache, they return to the front of the
waiting queue keeping their output, and the ratio rises so that fewer requests are admitted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import attrs
import structlog
from schedkit.components.io_struct import ControlReply
from schedkit.components.req_to_cache import cache_finished_req, fill_ids_prefix
from schedkit.components.schedule_batch import FinishAbort, ForwardMode, Req, ScheduleBatch
from schedkit.components.schedule_policy import SchedulePolicy

from schedkit.component import component

__all__ = ["CLIP_MAX_NEW_TOKENS", "RETRACT_DECODE_STEPS", "Scheduler"]

log = structlog.get_logger(__name__)

# Admission counts at most this many future tokens per request (SGLang's value).
CLIP_MAX_NEW_TOKENS = 4096
# After a retraction, the remaining requests must have room for this many decode steps.
RETRACT_DECODE_STEPS = 20


def _noop() -> None:
    return None


@component("scheduler")
class Scheduler:
    """Admits, batches, runs and retracts requests; see the module docstring.

    ``chunked_prefill_size`` None disables chunking. ``now`` stamps arrival times. The
    callbacks (``publish_kv_events``, ``maybe_log_idle_metrics``, ``on_pause``, ``get_loads``)
    are bound late to the KV-events publisher, metrics reporter and load inquirer.
    """

    request_receiver: Any
    allocator: Any
    tree_cache: Any
    policy: SchedulePolicy
    model_runner: Any
    batch_result_processor: Any
    now: Callable[[], float] = time.monotonic
    publish_kv_events: Callable[[], None] = _noop
    maybe_log_idle_metrics: Callable[[], None] = _noop
    on_pause: Callable[[], None] = _noop
    get_loads: Callable[[], dict] | None = None
    max_running_requests: int = 256
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = 8192
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.098
    new_token_ratio_decay_steps: int = 600
    sleep_on_idle_seconds: float = 0.001

    waiting_queue: list[Req] = attrs.field(init=False, factory=list)
    running_batch: ScheduleBatch = attrs.field(
        init=False, factory=lambda: ScheduleBatch(reqs=[], forward_mode=ForwardMode.DECODE)
    )
    chunked_req: Req | None = attrs.field(init=False, default=None)
    paused: bool = attrs.field(init=False, default=False)
    new_token_ratio: float = attrs.field(init=False, default=0.0)
    peak_running_requests: int = attrs.field(init=False, default=0)
    num_retracted: int = attrs.field(init=False, default=0)
    finished_count: int = attrs.field(init=False, default=0)
    _page_size: int = attrs.field(init=False, default=1)
    _ratio_decay: float = attrs.field(init=False, default=0.0)
    # Set when admission failed for lack of KV room; cleared when a request leaves or arrives.
    _prefill_blocked: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        for name in ("max_running_requests", "max_prefill_tokens", "new_token_ratio_decay_steps"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        self._page_size = self.allocator.page_size
        if self.tree_cache.page_size != self._page_size:
            raise ValueError(
                f"tree_cache.page_size ({self.tree_cache.page_size}) must equal "
                f"allocator.page_size ({self._page_size})"
            )
        size = self.chunked_prefill_size
        if size is not None and (not isinstance(size, int) or size < self._page_size):
            raise ValueError(
                "chunked_prefill_size must be None (no chunking) or an integer >= page_size "
                f"({self._page_size}), got {size!r}"
            )
        if not 0.0 <= self.min_new_token_ratio <= self.init_new_token_ratio <= 1.0:
            raise ValueError(
                "need 0 <= min_new_token_ratio <= init_new_token_ratio <= 1, got "
                f"{self.min_new_token_ratio} and {self.init_new_token_ratio}"
            )
        self.new_token_ratio = self.init_new_token_ratio
        self._ratio_decay = (
            self.init_new_token_ratio - self.min_new_token_ratio
        ) / self.new_token_ratio_decay_steps

    # ---- the loop ----------------------------------------------------------------------

    def step(self) -> bool:
        """One loop iteration; True if a batch ran."""
        for item in self.request_receiver.recv_requests():
            if isinstance(item, Req):
                self.submit(item)
            else:
                self._handle_control(item)
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
        self.new_token_ratio = self.init_new_token_ratio

    def _after_batch(self, batch: ScheduleBatch) -> None:
        """Move prefilled requests into the running batch; drop finished ones."""
        reqs = batch.reqs
        if batch.forward_mode == ForwardMode.EXTEND:
            running = self.running_batch.reqs
            for req in reqs:
                if req.finished_reason is not None:
                    self.finished_count += 1
                    self._prefill_blocked = False
                elif req is not self.chunked_req:
                    running.append(req)
            self.peak_running_requests = max(self.peak_running_requests, len(running))
            return
        alive = [req for req in reqs if req.finished_reason is None]
        if len(alive) != len(reqs):
            self.finished_count += len(reqs) - len(alive)
            self._prefill_blocked = False
            batch.reqs = alive

    # ---- requests ----------------------------------------------------------------------

    def submit(self, req: Req) -> None:
        """Queue a request, or finish it at once with FinishAbort if it is invalid or can
        never fit in the KV pool."""
        error = req.sampling_params.validation_error()
        if error is None and not req.origin_input_ids:
            error = "input_ids is empty; a request needs at least one prompt token"
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
        self.waiting_queue.append(req)
        self._prefill_blocked = False

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

    def _finish_aborted(self, req: Req, message: str) -> None:
        req.finished_reason = FinishAbort(message)
        req.is_chunked = False
        self.finished_count += 1
        self._prefill_blocked = False
        self.batch_result_processor.process_aborted([req])

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
            self.waiting_queue[:0] = retracted
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
        self.new_token_ratio = self.init_new_token_ratio
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
        """Continue the chunked request and admit waiting requests within the budgets."""
        running, chunked = self.running_batch.reqs, self.chunked_req
        if self._prefill_blocked or (
            chunked is None
            and (not self.waiting_queue or len(running) >= self.max_running_requests)
        ):
            return None
        allocator, tree_cache = self.allocator, self.tree_cache
        # Slots held back for the future tokens of the requests already running.
        offset = self.new_token_ratio * sum(map(_remaining_new, running))
        rem_input = self.max_prefill_tokens
        rem_chunk = self.chunked_prefill_size or 1 << 62
        batch = ScheduleBatch(reqs=[], forward_mode=ForwardMode.EXTEND)

        def add(req: Req, pre: int, ext: int) -> None:
            nonlocal offset, rem_input, rem_chunk
            req.num_computed_tokens = pre + ext
            req.is_chunked = pre + ext < req.seqlen
            if req.is_chunked:
                self.chunked_req = req
            else:
                offset += _remaining_new(req)
            batch.reqs.append(req)
            batch.prefix_lens.append(pre)
            batch.extend_lens.append(ext)
            rem_input -= ext
            rem_chunk -= ext

        if chunked is not None:
            self.chunked_req = None
            pre = len(chunked.kv_indices)
            rem_total = allocator.available_size() + tree_cache.evictable_size() - offset
            ext = min(chunked.seqlen - pre, rem_chunk, int(rem_total))
            if ext > 0 and self._alloc_extend(chunked, ext):
                add(chunked, pre, ext)
            else:
                self.chunked_req = chunked
        if self.chunked_req is None:
            self.policy.calc_priority(self.waiting_queue)
        admitted = 0
        for req in self.waiting_queue:
            if self.chunked_req is not None or rem_input <= 0 or rem_chunk <= 0:
                break
            if len(running) + len(batch.reqs) >= self.max_running_requests:
                break
            seqlen = req.seqlen
            match = tree_cache.match_prefix(fill_ids_prefix(req, -1))
            pre = len(match.device_indices)
            ext = seqlen - pre
            if ext > rem_input and batch.reqs:
                break
            req.swa_uuid_for_lock = tree_cache.inc_lock_ref(match.last_node)
            rem_total = allocator.available_size() + tree_cache.evictable_size() - offset
            if ext > rem_chunk:
                ext = rem_chunk - rem_chunk % self._page_size
            req.kv_indices = match.device_indices
            if (
                seqlen - pre + _remaining_new(req) > rem_total
                or ext <= 0
                or not self._alloc_extend(req, ext)
            ):
                req.kv_indices = []
                tree_cache.dec_lock_ref(match.last_node, req.swa_uuid_for_lock)
                break
            # A retracted request counts its re-used prefix again, as in SGLang.
            req.last_node, req.prefix_len = match.last_node, pre
            req.cached_tokens += pre
            req.cached_tokens_device += pre
            add(req, pre, ext)
            admitted += 1
        # Requests are admitted in queue order until the first that does not fit.
        del self.waiting_queue[:admitted]
        if not batch.reqs:
            # Nothing fits until a running request leaves (decoding goes on meanwhile).
            self._prefill_blocked = bool(running)
            return None
        return batch

    def update_running_batch(self) -> ScheduleBatch | None:
        """Give every running request one KV slot for its next token (retracting requests if
        the pool is short); the decode batch, or None if nothing runs."""
        batch = self.running_batch
        if not batch.reqs:
            return None
        if self._page_size > 1:
            return self._update_running_batch_paged(batch)
        if self._ensure_free(len(batch.reqs)):
            self._decay_new_token_ratio()
        else:
            self._retract_decode()
        reqs = batch.reqs
        slots = self.allocator.alloc(len(reqs))
        for req, slot in zip(reqs, slots, strict=True):
            req.kv_indices.append(slot)
            req.num_computed_tokens += 1
        return batch

    def _update_running_batch_paged(
        self, batch: ScheduleBatch, after_retract: bool = False
    ) -> ScheduleBatch:
        """``update_running_batch`` with page_size > 1: a request whose last page has room
        takes the next slot of that page, the others a new page each."""
        page_size = self._page_size
        # One pass: fill last pages, and collect the requests that need a new page.
        needs_page = []
        for req in batch.reqs:
            kv = req.kv_indices
            req.num_computed_tokens += 1
            if len(kv) % page_size:
                kv.append(kv[-1] + 1)  # the next slot of the request's last page
            else:
                needs_page.append(kv)
        need = len(needs_page) * page_size
        if not need or self._ensure_free(need):
            if not after_retract:
                self._decay_new_token_ratio()
        else:
            # Undo this step's slots, retract, and start over with the requests left.
            filled = set(map(id, needs_page))
            for req in batch.reqs:
                req.num_computed_tokens -= 1
                if id(req.kv_indices) not in filled:
                    req.kv_indices.pop()
            self._retract_decode()
            return self._update_running_batch_paged(batch, after_retract=True)
        if need:
            for kv, slot in zip(needs_page, self.allocator.alloc(need)[::page_size], strict=True):
                kv.append(slot)
        return batch

    def _decay_new_token_ratio(self) -> None:
        self.new_token_ratio = max(
            self.new_token_ratio - self._ratio_decay, self.min_new_token_ratio
        )

    # ---- KV memory ---------------------------------------------------------------------

    def _ensure_free(self, n: int) -> bool:
        """Make ``n`` slots free, evicting from the cache if needed; True if they are free."""
        shortfall = n - self.allocator.available_size()
        if shortfall > 0:
            self.tree_cache.evict(shortfall)
            return self.allocator.available_size() >= n
        return True

    def _decode_need(self, reqs: list[Req]) -> int:
        """Slots a decode step over ``reqs`` takes from the pool (whole pages)."""
        page_size = self._page_size
        if page_size == 1:
            return len(reqs)
        return page_size * [len(r.kv_indices) % page_size for r in reqs].count(0)

    def _alloc_extend(self, req: Req, n: int) -> bool:
        """Append ``n`` KV slots to ``req.kv_indices``, filling its last page first."""
        kv, page_size = req.kv_indices, self._page_size
        in_page = min(n, -len(kv) % page_size)
        rest = n - in_page
        pages = -(-rest // page_size)
        if not self._ensure_free(pages * page_size):
            return False
        slots = self.allocator.alloc(pages * page_size)
        if in_page:
            kv.extend(range(kv[-1] + 1, kv[-1] + 1 + in_page))
        kv.extend(slots[:rest])
        return True

    def _retract_decode(self) -> None:
        """Retract running requests until the rest have room for a few decode steps."""
        batch = self.running_batch
        keep = sorted(
            batch.reqs, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True
        )
        retracted: list[Req] = []
        # Slots the kept requests need for a few steps, and for the next one.
        room = sum(min(RETRACT_DECODE_STEPS, _remaining_new(r)) for r in keep)
        need = self._decode_need(keep)
        while len(keep) > 1:
            if retracted and self._ensure_free(max(room, need)):
                break
            req = keep.pop()
            room -= min(RETRACT_DECODE_STEPS, _remaining_new(req))
            need -= self._decode_need([req])
            retracted.append(req)
            self._retract(req)
        if not self._ensure_free(need) and self.chunked_req is not None:
            retracted.append(self.chunked_req)
            self._retract(self.chunked_req)
            self.chunked_req = None
        if not self._ensure_free(need):
            raise RuntimeError(
                f"the KV pool ({self.allocator.size} slots) cannot hold one more token of the "
                "last running request; requests longer than the pool should have been refused"
            )
        gone = set(retracted)
        batch.reqs = [r for r in batch.reqs if r not in gone]
        self.waiting_queue[:0] = retracted[::-1]  # the furthest along first
        decoded = sum(len(r.output_ids) for r in keep)
        total = sum(r.sampling_params.max_new_tokens for r in keep)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(keep)) / total)
        log.info("retracted requests", count=len(retracted), new_token_ratio=self.new_token_ratio)

    def _retract(self, req: Req) -> None:
        cache_finished_req(self.tree_cache, req)
        req.reset_for_retract()
        self.num_retracted += 1
        self._prefill_blocked = False


def _remaining_new(req: Req) -> int:
    return min(req.sampling_params.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS)
