"""The output streamer: decides which requests' new tokens go out after a step, and sends them.

One call of ``stream_output`` sends at most one batch message. A finished request is sent once;
an unfinished streaming request every ``stream_interval`` tokens; an unfinished non-streaming
request every ``force_stream_interval`` tokens (so that clients see progress of long requests).
Each send carries only the tokens produced since the request's previous send. A decode step or
run of an unchanging batch sends the same messages from the batch's kept columns
(``decode_step_stream``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import attrs

from schedkit.components.io.cache_hit_details import cached_tokens_details, details_column
from schedkit.components.io.decode_step_stream import DecodeStepStream
from schedkit.components.io.io_struct import (
    BatchEmbeddingOutput,
    BatchTokenIDOutput,
    RequestTimes,
)
from schedkit.components.io.steady_stream import SteadyStream
from schedkit.core.component import at_least, component
from schedkit.core.parallel_state import ParallelState
from schedkit.core.protocols import OutputSender, PrefixCache
from schedkit.core.schedule_batch import Req

__all__ = ["OutputStreamer"]


def _false() -> bool:
    return False


@component("output_streamer")
class OutputStreamer(DecodeStepStream):
    """Builds ``BatchTokenIDOutput`` (or ``BatchEmbeddingOutput``) messages and sends them.

    ``sender`` needs ``send(msg)``. ``stream_interval`` is the server default for streaming
    requests without their own; ``enable_hicache_storage`` is read at each call (the flag can
    flip at run time); ``get_load``, when given, supplies the load attached to messages that
    carry a finished request.
    """

    sender: OutputSender
    tree_cache: PrefixCache | None
    parallel_state: ParallelState
    stream_interval: int = attrs.field(default=1, validator=at_least(1))
    force_stream_interval: int = attrs.field(default=50, validator=at_least(1))
    is_generation: bool = True
    enable_hicache_storage: Callable[[], bool] = _false
    get_load: Callable[[], dict] | None = None
    _steady: SteadyStream = attrs.field(init=False, factory=SteadyStream, repr=False)
    # The sender takes a decode step's message already encoded (token_wire).
    _encoded: bool = attrs.field(init=False, default=False, repr=False)
    # ``stream_output`` is this class's own: a subclass's own is honoured by decode steps too.
    _own_stream_output: bool = attrs.field(init=False, default=True, repr=False)
    # The batch result processor hands decode steps to stream_decode_step.
    takes_decode_steps: ClassVar[bool] = True

    def __attrs_post_init__(self) -> None:
        self._encoded = getattr(self.sender, "takes_encoded", False) is True
        self._own_stream_output = type(self).stream_output is OutputStreamer.stream_output

    def stream_output(
        self,
        reqs: list[Req],
        return_logprob: bool = False,
        skip_req: Req | None = None,
        is_idle_batch: bool = False,
    ) -> None:
        """Send what is due for ``reqs`` (except ``skip_req``) in one message.

        ``return_logprob`` is accepted for parity with SGLang; schedkit computes no logprobs.
        ``is_idle_batch`` marks the empty batch of an idle step: under DP attention an empty
        message still goes out for it so that every DP rank reports each step.
        """
        if self.is_generation:
            self._steady.forget_any(reqs)  # what it kept of them may change here
            self._stream_output_generation(reqs, skip_req, is_idle_batch)
        else:
            self._stream_output_embedding(reqs)

    def _stream_output_generation(
        self, reqs: list[Req], skip_req: Req | None, is_idle_batch: bool
    ) -> None:
        default_interval = self.stream_interval
        force_interval = self.force_stream_interval
        due: list[Req] = []
        any_finished = False
        # Most requests are not due at most steps: the interval test comes first.
        for req in reqs:
            if req.finished_reason is None:
                num_output = len(req.output_ids)
                params = req.sampling_params
                if params.stream:
                    interval = params.stream_interval or default_interval
                    if interval > 1:
                        if num_output % interval != 1:
                            continue
                    elif num_output % interval:
                        continue
                elif num_output % force_interval:
                    continue
                if num_output <= req.send_token_offset or req is skip_req:
                    continue  # nothing new since the last send, or skipped
            else:
                if req.finished_output or req is skip_req:
                    continue
                req.finished_output = True
                any_finished = True
            due.append(req)

        if any_finished:
            self._steady.forget()
        if not due and not (is_idle_batch and self.parallel_state.enable_dp_attention):
            return

        output_ids = []
        for req in due:
            ids = req.output_ids
            output_ids.append(ids[req.send_token_offset :])
            req.send_token_offset = len(ids)
        self.sender.send(
            BatchTokenIDOutput(
                rids=[req.rid for req in due],
                finished_reasons=[req.finished_reason for req in due],
                output_ids=output_ids,
                prompt_tokens=[len(req.origin_input_ids) for req in due],
                completion_tokens=[req.send_token_offset for req in due],
                cached_tokens=[req.cached_tokens for req in due],
                cached_tokens_details=details_column(
                    due, self.enable_hicache_storage(), self.tree_cache
                ),
                dp_rank=self.parallel_state.dp_rank,
                load=self.get_load() if any_finished and self.get_load is not None else None,
                time_stats=_time_stats(due) if any_finished else None,
            )
        )

    def _stream_output_embedding(self, reqs: list[Req]) -> None:
        done = [req for req in reqs if req.finished_reason is not None and not req.finished_output]
        if not done:
            return
        for req in done:
            req.finished_output = True
        self.sender.send(
            BatchEmbeddingOutput(
                rids=[req.rid for req in done],
                finished_reasons=[req.finished_reason for req in done],
                prompt_tokens=[len(req.origin_input_ids) for req in done],
                cached_tokens=[req.cached_tokens for req in done],
                cached_tokens_details=details_column(
                    done, self.enable_hicache_storage(), self.tree_cache
                ),
                dp_rank=self.parallel_state.dp_rank,
            )
        )

    def get_cached_tokens_details(self, req: Req) -> dict | None:
        """The request's prefix-cache hits by tier, or None when it had none.

        ``{"device": d, "host": h}`` when any tier count is known and positive, plus
        ``storage`` (and ``storage_backend``) with hierarchical-cache storage;
        ``{"device": cached_tokens, "host": 0}`` when only the total is known.
        """
        return cached_tokens_details(req, self.enable_hicache_storage(), self.tree_cache)


def _time_stats(reqs: list[Req]) -> list[RequestTimes | None]:
    """Each finished request's arrival and first admission on this scheduler's clock."""
    return [
        None
        if req.finished_reason is None
        else RequestTimes(arrival_time=req.arrival_time, scheduled_time=req.scheduled_time)
        for req in reqs
    ]
