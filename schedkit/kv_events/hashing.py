"""Page hashes of a token sequence: a SHA-256 chain, one digest per page, and the hashes that
events carry for it.

Page i's digest is SHA-256 over the previous page's 32-byte digest (absent for a sequence's
first page) followed by the page's token ids as 4-byte little-endian unsigned integers. Events
carry the first 8 digest bytes read big-endian as a signed 64-bit integer (the plain hash).

A request may carry a namespace, ``extra_key`` and/or ``cache_salt`` (SGLang 0.5.23): its
published hashes are then ``first 8 bytes (big-endian, signed) of SHA-256(seed + plain hash as
8-byte big-endian signed)``, where the seed is SHA-256 over ``b"sglang-kv-event-namespace-v1"``
and, for each of (extra_key, cache_salt), ``b"\\x00"`` if absent, else ``b"\\x01"`` + its UTF-8
length as 8-byte little-endian + the UTF-8 bytes. The chain itself is never seeded, so tenants'
plain hashes agree and only what is published differs.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Sequence

__all__ = [
    "MAX_TOKEN_ID",
    "chain_pages",
    "digest_to_int",
    "namespace_seed",
    "namespaced_hash",
    "page_digests",
    "page_hashes",
]

MAX_TOKEN_ID = 2**32 - 1
_NAMESPACE_DOMAIN = b"sglang-kv-event-namespace-v1"

_sha256 = hashlib.sha256
_unpack_hash = struct.Struct(">q").unpack_from  # the first 8 bytes, big-endian, signed
_SWAP = sys.byteorder != "little"


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    try:
        packed = array("I", token_ids)
    except (OverflowError, TypeError):
        raise ValueError(f"token ids must be integers in [0, {MAX_TOKEN_ID}]") from None
    if packed.itemsize != 4:  # pragma: no cover - platforms where C int is not 32-bit
        packed = array("L", token_ids)
    if _SWAP:  # pragma: no cover - big-endian hosts
        packed.byteswap()
    return packed.tobytes()


def _field(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode()
    return b"\x01" + len(raw).to_bytes(8, "little") + raw


def namespace_seed(extra_key: str | None = None, cache_salt: str | None = None) -> bytes | None:
    """The seed that namespaces a request's published hashes; None without a namespace."""
    if extra_key is None and cache_salt is None:
        return None
    return _sha256(_NAMESPACE_DOMAIN + _field(extra_key) + _field(cache_salt)).digest()


def namespaced_hash(seed: bytes, plain_hash: int) -> int:
    """The published hash of a page whose plain hash is ``plain_hash``, under ``seed``."""
    digest = _sha256(seed + plain_hash.to_bytes(8, "big", signed=True)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def digest_to_int(digest: bytes) -> int:
    """The signed 64-bit plain hash that events carry for a page digest."""
    return _unpack_hash(digest)[0]


def page_digests(
    token_ids: Sequence[int], page_size: int, parent_digest: bytes | None = None
) -> list[bytes]:
    """The 32-byte digests of every full page of ``token_ids``, chained from ``parent_digest``
    (None for a sequence's first page). A trailing partial page is not hashed."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    raw = _token_bytes(token_ids)
    step = 4 * page_size
    end = (len(token_ids) // page_size) * step
    digests: list[bytes] = []
    add, sha256 = digests.append, _sha256
    prev = parent_digest if parent_digest is not None else b""
    for start in range(0, end, step):
        prev = sha256(prev + raw[start : start + step]).digest()
        add(prev)
    return digests


def chain_pages(
    token_ids: Sequence[int], page_size: int, parent_digest: bytes | None = None
) -> tuple[list[bytes], list[int]]:
    """``page_digests`` and the plain hash of each digest (what a cache keeps for a node)."""
    digests = page_digests(token_ids, page_size, parent_digest)
    return digests, [_unpack_hash(d)[0] for d in digests]


def page_hashes(
    token_ids: Sequence[int],
    page_size: int,
    parent_digest: bytes | None = None,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
) -> list[int]:
    """The hash an event carries for every full page of ``token_ids``: plain, or namespaced
    when ``extra_key`` or ``cache_salt`` is given. A router hashes a request with this to ask
    which pages a rank holds."""
    plain = [digest_to_int(d) for d in page_digests(token_ids, page_size, parent_digest)]
    seed = namespace_seed(extra_key, cache_salt)
    if seed is None:
        return plain
    return [namespaced_hash(seed, h) for h in plain]
