"""Requests and batches: what the scheduler queues, runs and reports on.

``Req`` carries a request from arrival to finish: its prompt, sampling parameters, output
tokens, finish reason, per-request streaming offset, cached-token counts by tier, KV slots and
timestamps. ``ScheduleBatch`` is what one forward pass runs.
"""

from __future__ import annotations

import enum
from array import array
from typing import Any, Protocol

import attrs
import msgspec

__all__ = [
    "MAX_TOKEN_ID",
    "FinishAbort",
    "FinishLength",
    "FinishMatchedToken",
    "FinishReason",
    "ForwardMode",
    "GenerationBatchResult",
    "Req",
    "SamplingParams",
    "ScheduleBatch",
]


# Token ids are unsigned 32-bit on the wire (KV-event hashing packs them in 4 bytes).
MAX_TOKEN_ID = 2**32 - 1


class FinishReason(msgspec.Struct, tag_field="type", frozen=True, gc=False):
    """Why a request finished; encodes as a map tagged under ``type`` like SGLang's ``to_json``."""


class FinishLength(FinishReason, tag="length", frozen=True, gc=False):
    """The request produced ``max_new_tokens`` tokens."""

    length: int


class FinishMatchedToken(FinishReason, tag="stop", frozen=True, gc=False):
    """The request produced a stop token (or EOS)."""

    matched: int


class FinishAbort(FinishReason, tag="abort", frozen=True, gc=False):
    """The request was refused or aborted; ``message`` says why."""

    message: str


@attrs.define(slots=True, kw_only=True)
class SamplingParams:
    """The parameters of one request that the scheduler acts on."""

    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] | list[int] = ()
    ignore_eos: bool = False
    stream: bool = False
    stream_interval: int | None = None
    # Stop tokens and EOS do not end the request before it has this many output tokens.
    min_new_tokens: int = 0

    def validation_error(self) -> str | None:
        """What is wrong with these parameters, or None when they are valid."""
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            return f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}"
        if self.stream_interval is not None and (
            not isinstance(self.stream_interval, int) or self.stream_interval < 1
        ):
            return f"stream_interval must be an integer >= 1, got {self.stream_interval!r}"
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            return f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}"
        if not isinstance(self.min_new_tokens, int) or self.min_new_tokens < 0:
            return f"min_new_tokens must be an integer >= 0, got {self.min_new_tokens!r}"
        if self.min_new_tokens > self.max_new_tokens:  # as SGLang's SamplingParams.verify
            return (
                f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], "
                f"got {self.min_new_tokens}"
            )
        return None


class DecodeRun(Protocol):
    """Per-token state a decode step keeps for its requests as one count per run (the next KV
    slots, token times) and writes into each request only when it is read or changed."""

    def complete(self, req: Req) -> None:
        """Write the request's pending per-token state into its fields."""

    def leave(self, req: Req) -> None:
        """Write the pending state, then stop keeping any for the request."""


@attrs.define(slots=True, kw_only=True, eq=False)
class Req:
    """One generation (or embedding) request and all the state the scheduler keeps for it."""

    rid: str
    # The prompt: a list of token ids, or packed, 4 bytes a token (``array('I')``), as a
    # request that came over the network or from a trace carries it (see
    # ``io_struct.GenerateReqInput.to_req``). Packed, it stays packed for its whole life: the
    # prefix cache matches, stores and hashes it as it is (``cache_keys``); either way it reads
    # as a sequence of ints.
    origin_input_ids: list[int] | array
    sampling_params: SamplingParams = attrs.Factory(SamplingParams)
    arrival_time: float = 0.0
    # Scheduling priority (higher runs first under the priority policy; None = default).
    priority: int | None = None
    # Prefix-cache namespaces: requests with different values never share cached KV, and
    # published page hashes are namespaced by them.
    extra_key: str | None = None
    cache_salt: str | None = None
    # Groups requests for the routing-key policy (SGLang's ``Req.routing_key``).
    routing_key: str | None = None

    output_ids: list[int] = attrs.Factory(list)
    finished_reason: FinishReason | None = None
    # True once the final output was sent: a finished request is sent exactly once.
    finished_output: bool = False
    # How many output tokens were already sent to the detokenizer (in a decode batch whose
    # columns the output streamer keeps, written when it stops keeping them: steady_stream).
    send_token_offset: int = 0
    # Prefix-cache hits, by tier (device = the radix cache on the accelerator).
    cached_tokens: int = 0
    cached_tokens_device: int = 0
    cached_tokens_host: int = 0
    cached_tokens_storage: int = 0

    # KV state: the slots holding this request's KV (prefix first; read and set through the
    # ``kv_indices`` property), and the locked cache node.
    _kv_indices: list[int] = attrs.Factory(list)
    # A decode run that adds this request's next slots in bulk (see ``DecodeRun``), or None;
    # ``kv_run_step`` is the run's step up to which ``_kv_indices`` is complete.
    kv_run: DecodeRun | None = attrs.field(default=None, repr=False)
    kv_run_step: int = attrs.field(default=0, repr=False)
    prefix_len: int = 0
    last_node: Any = None
    # What the cache's inc_lock_ref returned for last_node; dec_lock_ref takes it back.
    swa_uuid_for_lock: Any = None
    # The sliding-window part of that lock was released early (dec_swa_lock_only).
    swa_prefix_lock_released: bool = False
    is_chunked: bool = False
    is_retracted: bool = False
    retraction_count: int = 0

    # When the request last entered the waiting queue (on arrival, and again when retracted):
    # what orders equal priorities (SGLang's ``time_stats.wait_queue_entry_time``).
    wait_queue_entry_time: float = 0.0
    # When the request last left the waiting queue for a prefill batch (SGLang's
    # queue_time_end); with wait_queue_entry_time, its queue latency.
    wait_queue_exit_time: float = 0.0
    # The scheduler's count of prefilled tokens when the request arrived (HRRN's aging).
    arrival_processed_tokens: int = 0
    # When the request was first admitted to a prefill batch (its queue time ends there).
    scheduled_time: float | None = None
    first_token_time: float | None = None
    # Read and set through the ``last_token_time`` and ``itl`` properties.
    _last_token_time: float | None = None
    finish_time: float | None = None
    # Inter-token latencies measured at each decode step (simulated or wall seconds).
    _itl: list[float] = attrs.Factory(list)
    # A decode run that stamps this request's token times in bulk, or None; ``time_run_step``
    # is the run's step up to which ``_itl`` and ``_last_token_time`` are complete.
    time_run: DecodeRun | None = attrs.field(default=None, repr=False)
    time_run_step: int = attrs.field(default=0, repr=False)

    @property
    def kv_indices(self) -> list[int]:
        """One KV slot per token that has KV, the cached prefix first."""
        run = self.kv_run
        if run is not None:
            run.complete(self)
        return self._kv_indices

    @kv_indices.setter
    def kv_indices(self, value: list[int]) -> None:
        run = self.kv_run
        if run is not None:
            run.leave(self)
        self._kv_indices = value

    @property
    def last_token_time(self) -> float | None:
        """When the request's latest token was produced (None before its first)."""
        run = self.time_run
        if run is not None:
            run.complete(self)
        return self._last_token_time

    @last_token_time.setter
    def last_token_time(self, value: float | None) -> None:
        run = self.time_run
        if run is not None:
            run.leave(self)
        self._last_token_time = value

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: one per token after the first, the gap since the one before."""
        run = self.time_run
        if run is not None:
            run.complete(self)
        return self._itl

    @itl.setter
    def itl(self, value: list[float]) -> None:
        run = self.time_run
        if run is not None:
            run.leave(self)
        self._itl = value

    @property
    def stream(self) -> bool:
        return self.sampling_params.stream

    @property
    def num_computed_tokens(self) -> int:
        """Tokens computed so far (prompt chunks and generated tokens whose KV exists)."""
        return len(self.kv_indices)

    @property
    def seqlen(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def fill_ids(self) -> list[int]:
        """Every token of the request so far (the key its KV is cached under)."""
        return [*self.origin_input_ids, *self.output_ids]

    def finished(self) -> bool:
        return self.finished_reason is not None

    def check_finished(self, eos_token_id: int | None) -> None:
        """Set ``finished_reason`` after a token was appended (length, stop token or EOS)."""
        if self.finished_reason is not None:
            return
        params = self.sampling_params
        if len(self.output_ids) >= params.max_new_tokens:
            self.finished_reason = FinishLength(params.max_new_tokens)
            return
        if len(self.output_ids) < params.min_new_tokens:
            return
        last = self.output_ids[-1]
        if last in params.stop_token_ids or (not params.ignore_eos and last == eos_token_id):
            self.finished_reason = FinishMatchedToken(last)

    def reset_for_retract(self) -> None:
        """Forget KV state so the request can be scheduled again from the waiting queue."""
        self.kv_indices = []
        self.prefix_len = 0
        self.last_node = None
        self.is_chunked = False
        self.is_retracted = True
        self.retraction_count += 1


class ForwardMode(enum.IntEnum):
    """What a forward pass does: prefill (extend) new tokens, decode one token, or nothing."""

    EXTEND = 1
    DECODE = 2
    IDLE = 3


@attrs.define(slots=True, kw_only=True, eq=False)
class ScheduleBatch:
    """The requests of one forward pass.

    For ``EXTEND``, ``extend_lens[i]`` tokens of ``reqs[i]`` are computed on top of
    ``prefix_lens[i]`` tokens that already have KV, of which ``cache_hit_lens[i]`` came from
    the prefix cache just now (0 for a chunked request's later chunks, whose prefix it computed
    itself); for ``DECODE`` each request gets one token.
    """

    reqs: list[Req]
    forward_mode: ForwardMode
    prefix_lens: list[int] = attrs.Factory(list)
    extend_lens: list[int] = attrs.Factory(list)
    cache_hit_lens: list[int] = attrs.Factory(list)
    # Of the cache hits, the tokens loaded back from the host-memory tier.
    host_hit_tokens: int = 0

    def is_empty(self) -> bool:
        return not self.reqs

    def batch_size(self) -> int:
        return len(self.reqs)


@attrs.define(slots=True, kw_only=True, eq=False)
class GenerationBatchResult:
    """What the model runner returns: one next token per request (``None`` for a chunked
    prefill's middle chunk, which produces no token), and the step's duration in seconds."""

    next_token_ids: list[int | None]
    elapsed: float = 0.0
