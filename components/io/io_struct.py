"""The messages a scheduler exchanges with its clients, and their msgpack encoding.

Inbound (client -> scheduler, on the request socket): ``GenerateReqInput`` and ``ControlReq``.
Outbound (scheduler -> detokenizer, on the output socket): ``BatchTokenIDOutput`` and
``BatchEmbeddingOutput`` (declared in ``output_messages``, importable from here); a control
request is answered with a ``ControlReply``. Every message is a msgspec Struct tagged under
``kind``, so one decoder tells the message types of a socket apart.
The encoder and decoders are bound once at import. Nothing here decodes without a schema: a
message that fails to decode gives up its rid through ``rid_of``, a struct of the rid alone.

A request's token ids leave decoding as a list and enter the scheduler packed 4 bytes a token
(``array('I')``); the scheduler unpacks them when it admits the request into a batch.

``ControlRequest`` is the in-process form of a control message that a request receiver hands to
the scheduler: it carries the way back to the client that sent it.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Annotated, Any, Literal

import attrs
import msgspec

from schedkit.components.io.output_messages import (
    AnyFinishReason,
    BatchEmbeddingOutput,
    BatchTokenIDOutput,
    CachedTokensDetails,
    RequestTimes,
)
from schedkit.core.schedule_batch import FinishAbort as FinishAbort
from schedkit.core.schedule_batch import FinishLength as FinishLength
from schedkit.core.schedule_batch import FinishMatchedToken as FinishMatchedToken
from schedkit.core.schedule_batch import Req, SamplingParams
from schedkit.endpoints import check_endpoint

__all__ = [
    "AnyFinishReason",
    "BatchEmbeddingOutput",
    "BatchTokenIDOutput",
    "CachedTokensDetails",
    "ControlReply",
    "ControlReq",
    "ControlRequest",
    "ErrorReply",
    "GenerateReqInput",
    "RequestTimes",
    "SamplingParamsInput",
    "check_endpoint",
    "decode_output",
    "decode_reply",
    "decode_request",
    "decode_server_message",
    "encode",
    "rid_of",
]

# Token ids are hashed as 4-byte unsigned integers (KV-event page hashes).
TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
# Bounds on what one request may carry: larger inputs are refused at decoding, field named.
MAX_STOP_TOKEN_IDS = 256
MAX_INPUT_IDS = 1 << 20
MAX_ID_LENGTH = 256
ShortStr = Annotated[str, msgspec.Meta(max_length=MAX_ID_LENGTH)]


class SamplingParamsInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The wire form of ``SamplingParams``; out-of-range values fail to decode."""

    max_new_tokens: Annotated[int, msgspec.Meta(ge=1)] = 128
    stop_token_ids: Annotated[list[TokenId], msgspec.Meta(max_length=MAX_STOP_TOKEN_IDS)] = []
    ignore_eos: bool = False
    stream: bool = False
    stream_interval: Annotated[int, msgspec.Meta(ge=1)] | None = None
    min_new_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0

    def to_sampling_params(self) -> SamplingParams:
        """The scheduler's ``SamplingParams`` with the same values."""
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            stop_token_ids=tuple(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            stream=self.stream,
            stream_interval=self.stream_interval,
            min_new_tokens=self.min_new_tokens,
        )


class GenerateReqInput(
    msgspec.Struct, tag="generate", tag_field="kind", forbid_unknown_fields=True
):
    """A tokenized generation request. ``extra_key`` and ``cache_salt`` put it in a
    prefix-cache namespace of its own; ``priority`` is read by the priority policy; ``client``
    names the user a front end sends it for (an API key's digest): the scheduler shares its
    running batch fairly between connections and, within one, between these names."""

    rid: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_LENGTH)]
    input_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1, max_length=MAX_INPUT_IDS)]
    sampling_params: SamplingParamsInput = SamplingParamsInput()
    priority: int | None = None
    extra_key: ShortStr | None = None
    cache_salt: ShortStr | None = None
    client: ShortStr | None = None

    def to_req(self) -> Req:
        """A fresh scheduler ``Req`` for this request, its token ids packed (``array('I')``)
        until the scheduler admits it."""
        return Req(
            rid=self.rid,
            origin_input_ids=array("I", self.input_ids),
            sampling_params=self.sampling_params.to_sampling_params(),
            priority=self.priority,
            extra_key=self.extra_key,
            cache_salt=self.cache_salt,
        )


class ControlReq(
    msgspec.Struct,
    tag="control",
    tag_field="kind",
    forbid_unknown_fields=True,
    omit_defaults=True,
):
    """Pause or continue generation, flush the prefix cache, ask for the scheduler's load, or
    abort one of the client's own requests (``rid``).

    ``mode`` applies to ``pause``: ``retract`` puts running requests back in the queue,
    ``in_place`` keeps them where they are. ``pause``, ``continue`` and ``flush`` need
    ``token``, the admin token the server was started with. ``while_connected`` applies to
    ``pause``: generation continues by itself when the connection that paused it closes.
    """

    type: Literal["pause", "continue", "flush", "get_loads", "abort"]
    mode: Literal["retract", "in_place"] = "retract"
    rid: ShortStr | None = None
    token: ShortStr | None = None
    while_connected: bool = False


class ControlReply(msgspec.Struct, tag="control_reply", tag_field="kind"):
    """The answer to a ``ControlReq``: whether it worked, the loads for ``get_loads``."""

    type: str
    ok: bool
    loads: dict[str, Any] | None = None
    message: str | None = None


class ErrorReply(msgspec.Struct, tag="error", tag_field="kind"):
    """A message the server refused: ``message`` says what is wrong and where (for a request,
    the field, e.g. ``$.input_ids[3]``) and what would be valid; ``rid`` when it was known."""

    message: str
    rid: str | None = None


class _RidOnly(msgspec.Struct):
    """The rid of any message, every other field skipped unread."""

    rid: ShortStr | None = None


class _KindAndRid(msgspec.Struct):
    """The kind and rid of any message, every other field skipped unread."""

    kind: ShortStr | None = None
    rid: ShortStr | None = None


_encoder = msgspec.msgpack.Encoder()
_rid_decoder = msgspec.msgpack.Decoder(_RidOnly)
_kind_and_rid_decoder = msgspec.msgpack.Decoder(_KindAndRid)
_request_decoder = msgspec.msgpack.Decoder(GenerateReqInput | ControlReq)
_output_decoder = msgspec.msgpack.Decoder(BatchTokenIDOutput | BatchEmbeddingOutput)
_reply_decoder = msgspec.msgpack.Decoder(ControlReply)
_server_decoder = msgspec.msgpack.Decoder(
    BatchTokenIDOutput | BatchEmbeddingOutput | ControlReply | ErrorReply
)


def encode(msg: msgspec.Struct) -> bytes:
    """The msgpack bytes of any message in this module."""
    return _encoder.encode(msg)


def decode_request(data: bytes) -> GenerateReqInput | ControlReq:
    """A request message; raises ``msgspec.DecodeError`` (or its subclass
    ``msgspec.ValidationError``) naming what is wrong."""
    return _request_decoder.decode(data)


def rid_of(data: bytes | memoryview) -> str | None:
    """The rid of a message that failed to decode, if it is a map whose ``rid`` is a string of
    at most 256 characters; None otherwise. Like every decoder here it builds nothing for the
    fields it skips, and stops with ``RecursionError`` on nesting deeper than the interpreter's
    recursion limit (caught: None)."""
    try:
        return _rid_decoder.decode(data).rid
    except (msgspec.DecodeError, RecursionError):
        return None


def kind_and_rid(data: bytes | memoryview) -> tuple[str | None, str | None]:
    """A message's ``kind`` and ``rid``, each None unless the message is a map holding it as a
    string of at most 256 characters; skips the other fields as ``rid_of`` does (a fraction
    of a full decode for a long prompt)."""
    try:
        head = _kind_and_rid_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None, None
    return head.kind, head.rid


def decode_output(data: bytes) -> BatchTokenIDOutput | BatchEmbeddingOutput:
    """An output message, as sent by an output sender."""
    return _output_decoder.decode(data)


def decode_reply(data: bytes) -> ControlReply:
    """A reply to a control request."""
    return _reply_decoder.decode(data)


def decode_server_message(
    data: bytes,
) -> BatchTokenIDOutput | BatchEmbeddingOutput | ControlReply | ErrorReply:
    """Anything a ``zmq_server`` sends a client: outputs, control replies, refusals."""
    return _server_decoder.decode(data)


@attrs.define(slots=True, kw_only=True, eq=False)
class ControlRequest:
    """A control request inside the scheduler process.

    ``requeue`` (from a request edge, never from the wire) moves waiting request ``rid`` to the
    back of the waiting queue. ``reply(obj)`` answers the client: ``obj`` is a
    ``ControlReply``, a loads dict (for ``get_loads``), a bool (success, e.g. of a cache flush)
    or None (plain success). Replies are
    also kept in ``replies``. ``send_reply`` delivers the reply (the ZeroMQ receiver binds it to
    the client's identity); without one the reply is only kept.
    """

    type: Literal["pause", "continue", "flush", "get_loads", "abort", "requeue"]
    mode: Literal["retract", "in_place"] = "retract"
    rid: str | None = None
    send_reply: Callable[[ControlReply], None] | None = None
    replies: list[ControlReply] = attrs.Factory(list)

    def reply(self, obj: ControlReply | dict[str, Any] | bool | None = None) -> ControlReply:
        """Answer the client; returns the ``ControlReply`` sent."""
        if isinstance(obj, ControlReply):
            answer = obj
        elif isinstance(obj, dict):
            answer = ControlReply(type=self.type, ok=True, loads=obj)
        elif isinstance(obj, bool):
            answer = ControlReply(
                type=self.type, ok=obj, message=None if obj else f"{self.type} failed"
            )
        elif obj is None:
            answer = ControlReply(type=self.type, ok=True)
        else:
            raise TypeError(
                "reply takes a ControlReply, a loads dict, a bool or None, "
                f"got {type(obj).__name__}"
            )
        self.replies.append(answer)
        if self.send_reply is not None:
            self.send_reply(answer)
        return answer
