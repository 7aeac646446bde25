"""KV-cache event structs and their wire encodings under the ``sglang`` and ``vllm`` profiles.

The ``sglang`` structs are also the in-memory form: caches record them, publishers encode them,
subscribers decode into them whatever the profile on the wire.
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec

__all__ = [
    "PROFILES",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVCacheEvent",
    "KVEventBatch",
    "Profile",
    "decode_batch",
    "encode_batch",
    "get_profile",
]

MEDIUM_GPU = "GPU"


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the KV-cache events; on the wire the tag is the class name."""


class _SglangBlockStored(KVCacheEvent, tag="BlockStored"):
    # The sglang profile's BlockStored on the wire: the fields before cache_salt.
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class BlockStored(_SglangBlockStored, tag="BlockStored"):
    """Pages newly held by the cache, in order, with the hash of the page before the first."""

    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class BlockRemoved(KVCacheEvent):
    """Pages the cache no longer holds."""

    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The cache dropped every page."""


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A timestamped batch of events from one data-parallel rank."""

    ts: float
    events: list
    attn_dp_rank: int | None = None


class KVEventBatch(EventBatch):
    """The batch type that goes on the wire."""

    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]  # noqa: UP007


Event = Union[BlockStored, BlockRemoved, AllBlocksCleared]  # noqa: UP007


# vLLM profile: each event is a map tagged under "type"; the batch stays a positional array.


class _VllmEvent(msgspec.Struct, omit_defaults=True, gc=False, tag_field="type"):
    pass


class _VllmBlockStored(_VllmEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    lora_name: str | None = None


class _VllmBlockRemoved(_VllmEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class _VllmAllBlocksCleared(_VllmEvent, tag="AllBlocksCleared"):
    pass


class _VllmBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Union[_VllmBlockStored, _VllmBlockRemoved, _VllmAllBlocksCleared]]  # noqa: UP007
    data_parallel_rank: int | None = None


_TO_VLLM: dict[type, type] = {
    BlockStored: _VllmBlockStored,
    BlockRemoved: _VllmBlockRemoved,
    AllBlocksCleared: _VllmAllBlocksCleared,
}
_FROM_VLLM: dict[type, type] = {v: k for k, v in _TO_VLLM.items()}


def _convert(event: msgspec.Struct, classes: dict[type, type]) -> msgspec.Struct:
    # The families share their leading fields in one order; the trailing ones (our cache_salt,
    # session_id, lora_name; vLLM's lora_name) are not carried over.
    cls = classes[type(event)]
    return cls(*msgspec.structs.astuple(event)[: len(_SHARED.get(cls, cls.__struct_fields__))])


_SHARED: dict[type, tuple[str, ...]] = {
    _VllmBlockStored: _SglangBlockStored.__struct_fields__,
    BlockStored: _SglangBlockStored.__struct_fields__,
}


def _sglang_wire(batch: EventBatch) -> EventBatch:
    events = [
        _SglangBlockStored(*msgspec.structs.astuple(e)[:6]) if type(e) is BlockStored else e
        for e in batch.events
    ]
    return EventBatch(batch.ts, events, batch.attn_dp_rank)


class Profile:
    """One wire format: ``encode(batch) -> bytes`` and ``decode(bytes) -> KVEventBatch``."""

    __slots__ = ("decode", "encode", "name")

    def __init__(self, name: Literal["sglang", "vllm"]) -> None:
        self.name = name
        if name == "sglang":
            sglang_encode = msgspec.msgpack.Encoder().encode
            self.encode = lambda batch: sglang_encode(_sglang_wire(batch))
            self.decode = msgspec.msgpack.Decoder(KVEventBatch).decode
            return
        encoder = msgspec.msgpack.Encoder()
        decoder = msgspec.msgpack.Decoder(_VllmBatch)

        def encode(batch: EventBatch) -> bytes:
            events = [_convert(e, _TO_VLLM) for e in batch.events]
            return encoder.encode(_VllmBatch(batch.ts, events, batch.attn_dp_rank))

        def decode(payload: bytes) -> KVEventBatch:
            raw = decoder.decode(payload)
            events = [_convert(e, _FROM_VLLM) for e in raw.events]
            return KVEventBatch(raw.ts, events, raw.data_parallel_rank)

        self.encode = encode
        self.decode = decode


PROFILES = ("sglang", "vllm")
_profiles = {name: Profile(name) for name in PROFILES}


def get_profile(name: str) -> Profile:
    """The wire profile called ``name`` (``sglang`` or ``vllm``)."""
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
    """Decode one msgpack payload sent under ``profile`` into the in-memory structs."""
    return get_profile(profile).decode(payload)
