"""The scheduler's request lifecycle and control: submit, abort, requeue, pause, continue, flush."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, Literal

import attrs
import structlog

from schedkit.components.io.io_struct import ControlReply
from schedkit.core.schedule_batch import MAX_TOKEN_ID, FinishAbort, Req

__all__ = ["MIN_CONTEXT_LENGTH", "SchedulerRequests"]

# SGLang keeps max_req_input_len 5 tokens below max_req_len (min(context_len, KV pool) - 1)
# and needs it > 0: the smallest context (and pool) a scheduler with a context_length takes.
_INPUT_MARGIN = 5
MIN_CONTEXT_LENGTH = _INPUT_MARGIN + 2

# The scheduler's logger: its records name the scheduler whichever part of it logs.
log = structlog.get_logger("schedkit.components.scheduler.scheduler")


class SchedulerRequests:
    """Requests arriving, aborted or requeued, and the control requests (pause, continue,
    flush, loads) of ``Scheduler``. Mixed into it; adds no fields.

    Uses the scheduler's ``waiting_queue``, ``running_batch``, ``chunked_req``, ``paused``,
    ``allocator``, ``tree_cache``, ``batch_result_processor``, ``now``, ``on_pause``,
    ``get_loads``, ``processed_prefill_tokens``, ``context_length``, ``vocab_size``,
    ``allow_auto_truncate``, ``_max_req_len``, ``_page_size``, ``_ratio``,
    ``_prefill_blocked``, ``_retract`` and ``_finished``.
    """

    __slots__ = ()

    # ---- requests ----------------------------------------------------------------------

    def submit(self, req: Req) -> None:
        """Queue a request, or finish it at once with FinishAbort if it is invalid, outside
        the model's vocabulary or context (``vocab_size``, ``context_length``) or can never
        fit in the KV pool."""
        error = req.sampling_params.validation_error()
        ids = req.origin_input_ids
        if error is None and not ids:
            error = "input_ids is empty; a request needs at least one prompt token"
        packed = isinstance(ids, array) and ids.typecode == "I"  # in range by construction
        if error is None and not packed and (min(ids) < 0 or max(ids) > MAX_TOKEN_ID):
            error = f"input_ids must be token ids in [0, {MAX_TOKEN_ID}]"
        if error is None and self.vocab_size is not None:
            error = _vocabulary_error(ids, self.vocab_size)
        if error is None and self._max_req_len is not None:
            error = self._fit_to_context(req)
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

    def _fit_to_context(self, req: Req) -> str | None:
        """SGLang's arrival checks against the context (``validate_input_length`` and the
        clip of max_new_tokens in ``handle_generate_request``): the refusal message, or None
        once the prompt (cut with ``allow_auto_truncate``) and max_new_tokens fit."""
        max_req_len = self._max_req_len
        assert max_req_len is not None
        max_req_input_len = max_req_len - _INPUT_MARGIN
        prompt = len(req.origin_input_ids)
        if prompt >= max_req_input_len:
            if not self.allow_auto_truncate:
                return (
                    f"Input length ({prompt} tokens) exceeds the maximum allowed length "
                    f"({max_req_input_len} tokens). Use a shorter input or enable "
                    "--allow-auto-truncate."
                )
            log.warning(
                "prompt truncated to the context",
                rid=req.rid,
                input_len=prompt,
                max_req_input_len=max_req_input_len,
            )
            req.origin_input_ids = req.origin_input_ids[:max_req_input_len]
            prompt = max_req_input_len
        room = max_req_len - prompt - 1
        params = req.sampling_params
        if params.max_new_tokens > room:
            # A copy: one SamplingParams may be shared by many requests of a workload.
            req.sampling_params = attrs.evolve(params, max_new_tokens=room)
        return None

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


def _vocabulary_error(ids: Sequence[int], vocab_size: int) -> str | None:
    """SGLang's refusal of token ids at or above the vocabulary size (its tokenizer manager's
    ``_validate_input_ids_in_vocab``), naming the first such id instead of the whole prompt."""
    if max(ids) < vocab_size:
        return None
    position = next(i for i, token in enumerate(ids) if token >= vocab_size)
    return (
        f"The input_ids contains values greater than the vocab size ({vocab_size}): "
        f"token id {ids[position]} at position {position}."
    )
