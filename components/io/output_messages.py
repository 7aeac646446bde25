"""The messages a scheduler sends out with its requests' results: new token ids of a batch,
finished embeddings, each finished request's times (re-exported by ``io_struct``)."""

from __future__ import annotations

from typing import Any

import msgspec

from schedkit.core.schedule_batch import FinishAbort, FinishLength, FinishMatchedToken

__all__ = [
    "AnyFinishReason",
    "BatchEmbeddingOutput",
    "BatchTokenIDOutput",
    "CachedTokensDetails",
    "RequestTimes",
]

# The concrete finish reasons: decoding needs the union, not the base class.
AnyFinishReason = FinishLength | FinishMatchedToken | FinishAbort
CachedTokensDetails = dict[str, int | str]


class RequestTimes(msgspec.Struct):
    """When a request entered the scheduler (``arrival_time``) and was first admitted into a
    prefill batch (``scheduled_time``, None if never), in seconds on the scheduler's clock:
    the counterpart of SGLang's per-request ``time_stats`` column, from which a client
    takes the request's queue time on that scheduler."""

    arrival_time: float
    scheduled_time: float | None = None


class BatchTokenIDOutput(msgspec.Struct, tag="token_ids", tag_field="kind"):
    """New output tokens of a batch of generation requests, one column entry per request.

    ``output_ids[i]`` holds only the tokens produced since the previous send for ``rids[i]``;
    ``finished_reasons[i]`` is set on the request's last send. ``load`` is the scheduler's
    load, and ``time_stats`` each finished request's ``RequestTimes`` (None for the others),
    both attached when some request in the message finished (None otherwise).
    """

    rids: list[str]
    finished_reasons: list[AnyFinishReason | None]
    output_ids: list[list[int]]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    cached_tokens_details: list[CachedTokensDetails | None]
    dp_rank: int | None = None
    load: dict[str, Any] | None = None
    time_stats: list[RequestTimes | None] | None = None


class BatchEmbeddingOutput(msgspec.Struct, tag="embedding", tag_field="kind"):
    """Finished embedding (or reward) requests. ``embeddings`` is None when the model runner
    produced no vectors (the simulated runner produces none)."""

    rids: list[str]
    finished_reasons: list[AnyFinishReason]
    prompt_tokens: list[int]
    cached_tokens: list[int]
    cached_tokens_details: list[CachedTokensDetails | None] = []
    embeddings: list[list[float]] | None = None
    dp_rank: int | None = None
