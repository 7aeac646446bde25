"""The batch result processor: what happens to a batch's requests after the model ran it.

Prefill: each request that completed its prompt gets its first token and its finish state is
checked; finished requests hand their KV to the prefix cache, unfinished ones publish it there
(so that other requests can match it) and keep a lock on it. A chunked request's middle chunk
produces no token: its KV is published and it is not streamed. Then outputs are streamed and
prefill stats reported. Decode: the generated-token count grows, each request gets its token,
finished ones hand their KV to the cache, outputs are streamed, the decode counter advances and
decode stats are reported. An idle batch streams an empty batch.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from schedkit.components.scheduler.decode_tokens import DecodeTokens
from schedkit.core.component import component
from schedkit.core.protocols import DecodeStepCounter, KVAllocator, OutputStreamer, PrefixCache
from schedkit.core.schedule_batch import (
    FinishAbort,
    ForwardMode,
    GenerationBatchResult,
    Req,
    ScheduleBatch,
)

__all__ = ["BatchResultProcessor"]

_NO_TOKEN = "the model runner returned no token for this request"


def _noop(*_args: object) -> None:
    return None


@component("batch_result_processor", frozen=True)
class BatchResultProcessor:
    """Applies a ``GenerationBatchResult`` to its batch.

    The metrics callbacks and ``abort_request(rid)`` (the host drops the request from its
    queues) are bound late. ``now``, when given, stamps ``first_token_time``,
    ``last_token_time``, ``finish_time`` and the inter-token latencies ``itl`` of each request.
    ``allocator`` is accepted for parity with SGLang's collaborators but not used: all KV goes
    back through ``tree_cache`` (which frees into the allocator).
    """

    tree_cache: PrefixCache
    output_streamer: OutputStreamer
    allocator: KVAllocator | None = None
    eos_token_id: int | None = None
    report_prefill_stats: Callable[[ScheduleBatch], None] = _noop
    report_decode_stats: Callable[[ScheduleBatch], None] = _noop
    increment_generated_tokens: Callable[[int], None] = _noop
    advance_forward_ct_decode: Callable[[], None] = _noop
    abort_request: Callable[[str], None] = _noop
    now: Callable[[], float] | None = None
    _decode_tokens: DecodeTokens = attrs.field(init=False, factory=DecodeTokens)
    # The streamer's stream_decode_step(reqs, finished), when it has one: a decode step's
    # streaming told which requests finished, instead of finding out request by request.
    _stream_decode_step: Callable[[list[Req], list[Req]], None] | None = attrs.field(
        init=False, default=None
    )

    def __attrs_post_init__(self) -> None:
        streamer = self.output_streamer
        # Only a streamer that says so takes decode steps this way (a recording double of
        # one, which has the method but not the class attribute, sees stream_output).
        if getattr(streamer, "takes_decode_steps", False) is True:
            object.__setattr__(self, "_stream_decode_step", streamer.stream_decode_step)

    def process_batch_result(self, batch: ScheduleBatch, result: GenerationBatchResult) -> None:
        """Dispatch on the batch's forward mode."""
        mode = batch.forward_mode
        if mode == ForwardMode.DECODE:
            self.process_batch_result_decode(batch, result)
        elif mode == ForwardMode.EXTEND:
            self.process_batch_result_prefill(batch, result)
        else:
            self.output_streamer.stream_output(batch.reqs, False)

    def process_batch_result_prefill(
        self, batch: ScheduleBatch, result: GenerationBatchResult
    ) -> None:
        """First tokens, finish checks and cache updates after an extend batch."""
        reqs, tokens = batch.reqs, result.next_token_ids
        _check_lengths(reqs, tokens)
        tree_cache, eos = self.tree_cache, self.eos_token_id
        now = self.now() if self.now is not None else None
        chunked = None
        decode_tokens = self._decode_tokens
        for req, tok in zip(reqs, tokens, strict=True):
            if req in decode_tokens:  # prefilled while in the last decode batch
                decode_tokens.leave(req)
            if req.is_chunked:
                chunked = req
                tree_cache.cache_unfinished_req(req)
                continue
            if tok is None:
                self._abort(req, _NO_TOKEN)
                continue
            req.output_ids.append(tok)
            req.check_finished(eos)
            if now is not None:
                if req.last_token_time is None:
                    req.first_token_time = now
                else:  # a retracted request's first token after its re-prefill
                    req.itl.append(now - req.last_token_time)
                req.last_token_time = now
            if req.finished_reason is not None:
                req.finish_time = now
                tree_cache.cache_finished_req(req)
            else:
                tree_cache.cache_unfinished_req(req)
        self.output_streamer.stream_output(reqs, False, chunked)
        self.report_prefill_stats(batch)

    def process_batch_result_decode(
        self, batch: ScheduleBatch, result: GenerationBatchResult
    ) -> None:
        """Append one token per request, release finished requests, stream, report."""
        reqs, tokens = batch.reqs, result.next_token_ids
        _check_lengths(reqs, tokens)
        if None in tokens:
            self._decode_tokens.disband()
            self._process_decode_with_missing(batch, reqs, tokens)
            return
        self.increment_generated_tokens(len(reqs))
        eos = self.eos_token_id
        now = self.now() if self.now is not None else None
        tree_cache, decode_tokens = self.tree_cache, self._decode_tokens
        done = []
        # The few requests that may have finished, in batch order.
        for req in decode_tokens.advance(reqs, tokens, now, eos):
            req.check_finished(eos)
            if req.finished_reason is not None:
                if now is not None and req.finish_time is None:
                    req.finish_time = now
                tree_cache.cache_finished_req(req)
                decode_tokens.leave(req)  # nothing of it is kept once it is done
                done.append(req)
        if self._stream_decode_step is not None and decode_tokens.none_finished_before:
            self._stream_decode_step(reqs, done)
        else:
            self.output_streamer.stream_output(reqs, False)
        self.advance_forward_ct_decode()
        self.report_decode_stats(batch)

    def decode_run_steps(self, reqs: list[Req], limit: int, clock: float) -> int:
        """How many of the next ``limit`` decode steps of ``reqs`` (the batch of the last
        decode step, unchanged) ``process_decode_run`` may apply at once: steps that give no
        request its last token by length (the caller stops before a step giving one the EOS
        token) and that the streamer can stream together; 0 when there is no clock or the
        streamer does not take decode steps. ``clock``: the model runner's time, which
        ``now`` must give (the step times logged are the runner's)."""
        if self.now is None or self._stream_decode_step is None or self.now() != clock:
            return 0
        limit = min(limit, self._decode_tokens.quiet_steps(reqs))
        return self.output_streamer.decode_run_steps(reqs, limit) if limit > 0 else 0

    def process_decode_run(
        self,
        batch: ScheduleBatch,
        tokens: list[list[int]],
        times: list[float],
        counter: DecodeStepCounter,
    ) -> None:
        """``len(times)`` decode steps of ``batch`` (at most ``decode_run_steps``) at once:
        each request's ``tokens`` (one per step, none ``eos_token_id``) appended, each step's
        end time logged, the steps streamed and counted by ``counter`` (the metrics reporter,
        the last step ending with ``report_decode_stats`` as every step does), with the
        results of as many ``process_batch_result_decode`` calls."""
        steps = len(times)
        reqs = batch.reqs
        self._decode_tokens.advance_run(tokens, times)
        self.output_streamer.stream_decode_run(reqs, steps)
        counter.advance_decode_run(times, len(reqs))
        self.report_decode_stats(batch)

    def _process_decode_with_missing(
        self, batch: ScheduleBatch, reqs: list[Req], tokens: list[int | None]
    ) -> None:
        """A decode step in which the model runner gave some requests no token: those are
        aborted, the others handled one by one."""
        reqs, tokens = self._abort_missing(reqs, tokens)
        self.increment_generated_tokens(len(reqs))
        eos = self.eos_token_id
        now = self.now() if self.now is not None else None
        for req, tok in zip(reqs, tokens, strict=True):
            req.output_ids.append(tok)
        if now is not None:
            self._stamp_decode(reqs, now)
        tree_cache = self.tree_cache
        for req in reqs:
            req.check_finished(eos)
            if req.finished_reason is not None:
                if now is not None and req.finish_time is None:
                    req.finish_time = now
                tree_cache.cache_finished_req(req)
        if now is not None:
            # Requests aborted for a missing token that are still in the batch are stamped
            # too (finish time, and the step's inter-token latency).
            kept = set(reqs)
            self._stamp_decode([r for r in batch.reqs if r not in kept], now)
        self.output_streamer.stream_output(batch.reqs, False)
        self.advance_forward_ct_decode()
        self.report_decode_stats(batch)

    def process_aborted(self, reqs: list[Req]) -> None:
        """Release the KV of requests finished out of band (aborted, refused) and stream them."""
        for req in reqs:
            if req in self._decode_tokens:
                self._decode_tokens.leave(req)
            if req.kv_indices or req.last_node is not None:
                self.tree_cache.cache_finished_req(req)
            if self.now is not None and req.finish_time is None:
                req.finish_time = self.now()
        self.output_streamer.stream_output(reqs, False)

    def _abort_missing(
        self, reqs: list[Req], tokens: list[int | None]
    ) -> tuple[list[Req], list[int]]:
        kept_reqs, kept_tokens = [], []
        for req, tok in zip(reqs, tokens, strict=True):
            if tok is None:
                self._abort(req, _NO_TOKEN)
            else:
                kept_reqs.append(req)
                kept_tokens.append(tok)
        return kept_reqs, kept_tokens

    def _abort(self, req: Req, message: str) -> None:
        if req.finished_reason is None:
            req.finished_reason = FinishAbort(message)
        self.tree_cache.cache_finished_req(req)
        self.abort_request(req.rid)

    @staticmethod
    def _stamp_decode(reqs: list[Req], now: float) -> None:
        for req in reqs:
            if req.last_token_time is not None:
                req.itl.append(now - req.last_token_time)
            req.last_token_time = now
            if req.finished_reason is not None and req.finish_time is None:
                req.finish_time = now


def _check_lengths(reqs: list[Req], tokens: list[int | None]) -> None:
    if len(tokens) != len(reqs):
        raise ValueError(
            f"the result has {len(tokens)} next tokens for a batch of {len(reqs)} requests; "
            "the model runner must return one entry per request"
        )
