"""A decode step's ``BatchTokenIDOutput`` put straight into its wire form from kept columns.

While a decode batch stays the same, the request ids, prompt lengths and cache hits of its
streamed messages do not change (``SteadyColumns``): their msgpack encodings are kept too, and
each step encodes only its new tokens and completion counts. ``_TokenIDColumns`` declares the
same tag and fields, in the same order, as ``BatchTokenIDOutput`` with the kept columns as
``msgspec.Raw``, so msgspec writes the very bytes ``encode`` gives for the whole message.

A sender that says ``takes_encoded`` (true) is given an ``EncodedTokenIDOutput`` for such a
step: the bytes, with the columns a sender counts from; any other sender keeps getting
``BatchTokenIDOutput`` objects.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import msgspec

from schedkit.components.io.io_struct import BatchTokenIDOutput, RequestTimes, decode_output

__all__ = ["EncodedTokenIDOutput", "encode_columns", "encode_step"]

_encode = msgspec.msgpack.Encoder().encode
_LAST_TOKEN = itemgetter(-1)


class _TokenIDColumns(msgspec.Struct, tag="token_ids", tag_field="kind"):
    """``BatchTokenIDOutput`` with its columns already encoded (same tag, fields, order)."""

    rids: msgspec.Raw
    finished_reasons: msgspec.Raw
    output_ids: list[tuple[int]]  # one 1-tuple per request: encoded as [token]
    prompt_tokens: msgspec.Raw
    completion_tokens: list[int]
    cached_tokens: msgspec.Raw
    cached_tokens_details: msgspec.Raw
    dp_rank: int | None = None
    load: dict[str, Any] | None = None
    time_stats: list[RequestTimes | None] | None = None


class EncodedTokenIDOutput:
    """A ``BatchTokenIDOutput`` in its wire form: ``wire`` holds exactly the bytes
    ``encode`` gives for it. ``rids`` (the message's column, not to be changed),
    ``finished_rids`` (those that finished with it) and ``output_tokens`` (new tokens in all)
    are what a sender counts from; ``message()`` decodes the whole message."""

    __slots__ = ("finished_rids", "output_tokens", "rids", "wire")

    def __init__(
        self, wire: bytes, rids: list[str], finished_rids: list[str], output_tokens: int
    ) -> None:
        self.wire = wire
        self.rids = rids
        self.finished_rids = finished_rids
        self.output_tokens = output_tokens

    def message(self) -> BatchTokenIDOutput:
        """The message, decoded from ``wire``."""
        return decode_output(self.wire)


def _array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def encode_columns(
    rids: list[str], prompt_tokens: list[int], cached_tokens: list[int], details: list
) -> tuple[msgspec.Raw, msgspec.Raw, msgspec.Raw, msgspec.Raw, msgspec.Raw]:
    """The kept columns encoded once: rids, prompt tokens, cached tokens, cache-hit details,
    and the finish reasons of a step at which none finished (all None)."""
    return (
        msgspec.Raw(_encode(rids)),
        msgspec.Raw(_encode(prompt_tokens)),
        msgspec.Raw(_encode(cached_tokens)),
        msgspec.Raw(_encode(details)),
        msgspec.Raw(_array_header(len(rids)) + b"\xc0" * len(rids)),
    )


def encode_step(
    columns: tuple[msgspec.Raw, ...],
    outputs: list[list[int]],
    lengths: list[int],
    rids: list[str],
    reasons: list | None,
    finished_rids: list[str],
    dp_rank: int | None,
    load: dict[str, Any] | None,
    time_stats: list[RequestTimes | None] | None,
) -> EncodedTokenIDOutput:
    """The message of a step at which each request got one token, the last of its
    ``outputs`` list, and streams it alone: ``columns`` from ``encode_columns``, ``lengths``
    each request's output length, ``reasons`` its finish reason (None: none finished) and
    ``finished_rids`` the rids of those that finished."""
    rid_col, prompt_col, cached_col, details_col, no_reasons = columns
    reasons_col = no_reasons if reasons is None else msgspec.Raw(_encode(reasons))
    wire = _encode(
        _TokenIDColumns(
            rid_col,
            reasons_col,
            list(zip(map(_LAST_TOKEN, outputs))),
            prompt_col,
            lengths,
            cached_col,
            details_col,
            dp_rank,
            load,
            time_stats,
        )
    )
    return EncodedTokenIDOutput(wire, rids, finished_rids, len(outputs))
