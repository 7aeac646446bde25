"""The wire encodings of KV-cache event batches, one profile per engine release.

Every profile encodes the in-memory structs of ``event_structs`` and decodes into them. The
profile table, ``PROFILES``, is the one place that says what each engine puts on the wire:

- ``sglang`` (SGLang >= 0.5.23): each event a msgpack map ``{"type": "BlockStored", ...}`` with
  None-valued optional fields left out; the batch ``[ts, events, attn_dp_rank]``.
- ``sglang-array`` (older SGLang, what llm-d's adapter reads): each event a msgpack array whose
  first element is the tag: ``["BlockStored", hashes, parent, tokens, block_size, lora_id,
  medium]``.
- ``vllm`` (vLLM >= 0.33): each event a map tagged under ``type``; ``BlockStored`` always carries
  ``medium`` and ``lora_name`` and ``BlockRemoved`` always carries ``medium``, None included;
  vLLM 0.33's defaulted fields (``group_idx``, ``kv_cache_spec_kind``, ``locality``,
  ``session_id``, ...) only when set.

Decoding does not need to know the profile: each event is read as a map or an array by its
first byte, so a subscriber follows any of these streams.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from operator import attrgetter
from typing import Literal, TypeVar, Union

import msgspec

from schedkit.kv_events import packed_ids
from schedkit.kv_events.engine_wire import (
    ArrayAllBlocksCleared,
    ArrayBatch,
    ArrayBlockRemoved,
    ArrayBlockStored,
    SglangBatch,
    VllmAllBlocksCleared,
    VllmBatch,
    VllmBlockRemoved,
    VllmBlockStored,
    to_memory,
)
from schedkit.kv_events.event_structs import (
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    KVEventBatch,
)

__all__ = [
    "MAX_BATCH_BYTES",
    "PROFILES",
    "Profile",
    "ProfileName",
    "decode_any",
    "decode_batch",
    "encode_batch",
    "get_profile",
]

# The largest batch payload decoded (a bigger one is a decode error); subscribers also refuse
# bigger messages on the socket (ZMQ_MAXMSGSIZE). A 128k-token prefill at page size 1 sends
# about 1.8 MB.
MAX_BATCH_BYTES = 4 << 20

ProfileName = Literal["sglang", "sglang-array", "vllm"]


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    attn_dp_rank: int | None = None


# A map event may come from any map profile: read it with every field any of them sends.
_decode_map_event = msgspec.msgpack.Decoder(Event).decode
_decode_array_event = msgspec.msgpack.Decoder(
    Union[ArrayBlockStored, ArrayBlockRemoved, ArrayAllBlocksCleared]  # noqa: UP007
).decode
_decode_raw_batch = msgspec.msgpack.Decoder(_RawBatch).decode
_decode_map_batch = msgspec.msgpack.Decoder(KVEventBatch).decode


def _not_utf8(exc: UnicodeDecodeError) -> msgspec.DecodeError:
    # msgspec raises UnicodeDecodeError for a string that is not UTF-8: a decode error too.
    return msgspec.DecodeError(f"a string is not UTF-8 ({exc.reason} at byte {exc.start})")


# msgspec skips an unknown field by walking it, one C call per level, under Python's recursion
# check: nesting deeper than the interpreter's stack allows raises RecursionError. Every field
# the schema knows is at most 4 levels deep, so a payload that goes that deep is malformed.
_TOO_DEEP = "nested too deep to decode (deeper than Python's recursion limit, ~1,000 levels)"


_Decoded = TypeVar("_Decoded")


def _bounded(decode: Callable[[bytes], _Decoded]) -> Callable[[bytes], _Decoded]:
    """``decode`` that refuses a payload over ``MAX_BATCH_BYTES`` or nested too deep, and one
    with a string that is not UTF-8, as ``msgspec.DecodeError``; a page hash sent as bytes is
    a ``ValidationError`` that says so."""

    def bounded_decode(payload: bytes) -> _Decoded:
        if len(payload) > MAX_BATCH_BYTES:
            raise msgspec.DecodeError(
                f"a batch of {len(payload)} bytes, over the {MAX_BATCH_BYTES}-byte bound"
            )
        try:
            return decode(payload)
        except UnicodeDecodeError as exc:
            raise _not_utf8(exc) from None
        except RecursionError:
            raise msgspec.DecodeError(_TOO_DEEP) from None
        except msgspec.ValidationError as exc:
            raise _explain(exc) from None

    return bounded_decode


# vLLM publishes its page hashes as bytes when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
_BYTES_HASH = re.compile(r"got `bytes` - at `(\$[^`]*(?:block_hashes|parent_block_hash)[^`]*)`")


def _explain(exc: msgspec.ValidationError) -> msgspec.ValidationError:
    """``exc``, saying what to do when it is a page hash sent as bytes."""
    found = _BYTES_HASH.search(str(exc))
    if found is None:
        return exc
    return msgspec.ValidationError(
        f"block hashes are bytes at `{found.group(1)}`: run vLLM with "
        "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 (pages are keyed by 64-bit int hashes, as "
        "SGLang, Dynamo's router and vLLM's default send them)"
    )


def _strict_decoder(batch_type: type) -> Callable[[bytes], KVEventBatch]:
    decode = msgspec.msgpack.Decoder(batch_type).decode

    def strict_decode(payload: bytes) -> KVEventBatch:
        raw = decode(payload)
        events = [to_memory(e) for e in raw.events]
        return KVEventBatch(raw.ts, events, msgspec.structs.astuple(raw)[2])

    return _bounded(strict_decode)


def _reencoder(batch_type: type) -> Callable[[bytes], bytes]:
    decode = msgspec.msgpack.Decoder(batch_type).decode
    encode = msgspec.msgpack.Encoder().encode
    return _bounded(lambda payload: encode(decode(payload)))


def _decode_event(raw: msgspec.Raw) -> Event:
    # msgpack maps start with 0x80-0x8f, 0xde or 0xdf; anything else here is an array.
    first = memoryview(raw)[0]
    if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF):
        return _decode_map_event(raw)
    return to_memory(_decode_array_event(raw))


def _decode_any(payload: bytes) -> KVEventBatch:
    try:
        return _decode_map_batch(payload)
    except msgspec.DecodeError:
        raw = _decode_raw_batch(payload)
    events = []
    for i, event in enumerate(raw.events):
        try:
            events.append(_decode_event(event))
        except msgspec.ValidationError as exc:  # say where in the batch, as the batch decoder
            raise msgspec.ValidationError(str(exc).replace("`$", f"`$[1][{i}]")) from None
    return KVEventBatch(raw.ts, events, raw.attn_dp_rank)


_bounded_decode_any = _bounded(_decode_any)


def decode_any(payload: bytes) -> KVEventBatch:
    """Decode a batch sent under any profile, telling map events from array events; raises
    ``msgspec.DecodeError`` (or its ``ValidationError``) for anything else, a payload over
    ``MAX_BATCH_BYTES`` or nested too deep included."""
    return _bounded_decode_any(payload)


def _converter(stored: type, removed: type, cleared: type) -> Callable[[Event], msgspec.Struct]:
    """Converts in-memory events to one profile's structs; an event keeps the fields the
    profile declares, by name (those it declares and memory has not stay at their default)."""
    stored_prefix, stored_rest = _shared_fields(stored, BlockStored)
    removed_prefix, removed_rest = _shared_fields(removed, BlockRemoved)

    def convert(event: Event) -> msgspec.Struct:
        kind = type(event)
        if kind is BlockStored:
            out, rest = stored(*stored_prefix(event)), stored_rest
        elif kind is BlockRemoved:
            out, rest = removed(*removed_prefix(event)), removed_rest
        else:
            return cleared()
        for name in rest:  # fields past the shared prefix: set only when memory has a value
            value = getattr(event, name)
            if value is not None:
                setattr(out, name, value)
        return out

    return convert


def _shared_fields(target: type, source: type) -> tuple[Callable[[Event], tuple], list[str]]:
    """For the fields ``target`` and ``source`` share: a getter of the longest leading run of
    ``target``'s fields that ``source`` has (its positional arguments), and the others."""
    shared = [name for name in target.__struct_fields__ if name in source.__struct_fields__]
    prefix = 0
    while prefix < len(shared) and shared[prefix] == target.__struct_fields__[prefix]:
        prefix += 1
    if prefix < 2:  # attrgetter of one name returns the value, not a tuple
        raise TypeError(f"{target.__name__} shares fewer than 2 leading fields with memory")
    return attrgetter(*shared[:prefix]), shared[prefix:]


class Profile:
    """One wire format: ``encode(batch) -> bytes``; ``decode(bytes) -> KVEventBatch`` reads
    this profile and every other one; ``strict_decode`` reads only this one, with the
    engine's own declarations (a conformance check), and ``reencode`` encodes what those
    declarations read of a payload back with them (what that engine would have sent)."""

    __slots__ = ("convert", "decode", "encode", "name", "reencode", "strict_decode")

    def __init__(
        self,
        name: ProfileName,
        engine_batch: type,
        convert: Callable[[Event], msgspec.Struct] | None = None,
    ) -> None:
        self.name = name
        self.convert = convert
        self.strict_decode = _strict_decoder(engine_batch)
        self.reencode = _reencoder(engine_batch)
        # Packed token ids (a cache's packed prompt) go out as the same array of ints.
        encode = msgspec.msgpack.Encoder(enc_hook=packed_ids.enc_hook).encode
        if convert is None:
            self.encode = encode
        else:

            def encode_converted(batch: EventBatch) -> bytes:
                events = [convert(e) for e in batch.events]
                return encode(EventBatch(batch.ts, events, batch.attn_dp_rank))

            self.encode = encode_converted
        self.decode = decode_any


_profiles = {
    "sglang": Profile("sglang", SglangBatch),
    "sglang-array": Profile(
        "sglang-array",
        ArrayBatch,
        _converter(ArrayBlockStored, ArrayBlockRemoved, ArrayAllBlocksCleared),
    ),
    "vllm": Profile(
        "vllm",
        VllmBatch,
        _converter(VllmBlockStored, VllmBlockRemoved, VllmAllBlocksCleared),
    ),
}
PROFILES: tuple[str, ...] = tuple(_profiles)


def get_profile(name: str) -> Profile:
    """The wire profile called ``name`` (one of ``PROFILES``)."""
    try:
        return _profiles[name]
    except KeyError:
        raise ValueError(
            f"unknown KV-events profile {name!r}; valid: {', '.join(PROFILES)}"
        ) from None


def encode_batch(batch: EventBatch, profile: str = "sglang") -> bytes:
    """Encode one batch as msgpack under ``profile``."""
    return get_profile(profile).encode(batch)


def decode_batch(payload: bytes, profile: str = "sglang") -> KVEventBatch:
    """Decode one msgpack payload into the in-memory structs. Every profile decodes every
    stream (``profile`` is accepted for symmetry with ``encode_batch``)."""
    return get_profile(profile).decode(payload)
