"""Page hashes of a token sequence: a SHA-256 chain, one digest per page, as SGLang publishes them.

Page i's digest is SHA-256 over the previous page's 32-byte digest (absent for a sequence's first
page) followed by the page's token ids as 4-byte little-endian unsigned integers. Events carry
the first 8 digest bytes read big-endian as a signed 64-bit integer (the *plain* hash).

A request with a namespace (``extra_key`` and / or ``cache_salt``) publishes namespaced hashes
instead: ``seed = SHA-256(b"sglang-kv-event-namespace-v1" + field(extra_key) +
field(cache_salt))`` where an absent field is ``b"\\x00"`` and a present one ``b"\\x01"`` + its
UTF-8 length as 8-byte little-endian + the UTF-8 bytes; the published hash of a page is the
signed first 8 bytes of ``SHA-256(seed + plain_hash as 8-byte big-endian signed)``. The plain
chain itself is never seeded, so namespaced parents are namespaced the same way.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence

from schedkit.core.schedule_batch import MAX_TOKEN_ID

__all__ = [
    "MAX_TOKEN_ID",
    "digest_to_int",
    "namespace_seed",
    "namespaced_hash",
    "page_digests",
    "page_hashes",
    "published_page_hashes",
    "token_bytes",
]

_sha256 = hashlib.sha256
_SWAP = sys.byteorder != "little"
_NAMESPACE_TAG = b"sglang-kv-event-namespace-v1"


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """The token ids packed as 4-byte little-endian unsigned integers (what pages hash over)."""
    try:
        packed = array("I", token_ids)
    except (OverflowError, TypeError):
        raise ValueError(f"token ids must be integers in [0, {MAX_TOKEN_ID}]") from None
    if packed.itemsize != 4:  # pragma: no cover - platforms where C int is not 32-bit
        packed = array("L", token_ids)
    if _SWAP:  # pragma: no cover - big-endian hosts
        packed.byteswap()
    return packed.tobytes()


def namespace_seed(extra_key: str | None = None, cache_salt: str | None = None) -> bytes | None:
    """The 32-byte seed that namespaces published hashes; None when there is no namespace."""
    if extra_key is None and cache_salt is None:
        return None
    data = bytearray(_NAMESPACE_TAG)
    for field in (extra_key, cache_salt):
        if field is None:
            data += b"\x00"
        else:
            raw = field.encode()
            data += b"\x01" + len(raw).to_bytes(8, "little") + raw
    return _sha256(bytes(data)).digest()


def namespaced_hash(seed: bytes, plain_hash: int) -> int:
    """The published hash of a page whose plain hash is ``plain_hash``, under ``seed``."""
    digest = _sha256(seed + plain_hash.to_bytes(8, "big", signed=True)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def digest_to_int(digest: bytes) -> int:
    """The signed 64-bit integer that events carry for a page digest."""
    return int.from_bytes(digest[:8], "big", signed=True)


def page_digests(
    token_ids: Sequence[int], page_size: int, parent_digest: bytes | None = None
) -> list[bytes]:
    """The 32-byte digests of every full page of ``token_ids``, chained from ``parent_digest``.

    A trailing partial page is not hashed.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    raw = token_bytes(token_ids)
    step = 4 * page_size
    end = (len(token_ids) // page_size) * step
    digests = []
    prev = parent_digest if parent_digest is not None else b""
    for start in range(0, end, step):
        prev = _sha256(prev + raw[start : start + step]).digest()
        digests.append(prev)
    return digests


def published_page_hashes(
    token_ids: Sequence[int],
    page_size: int,
    extra_key: str | None = None,
    cache_salt: str | None = None,
) -> list[int]:
    """The hash a cache publishes for every full page of ``token_ids`` (a sequence from its
    first page) in the namespace ``(extra_key, cache_salt)``: what a router matches against."""
    return page_hashes(token_ids, page_size, extra_key=extra_key, cache_salt=cache_salt)


def page_hashes(
    token_ids: Sequence[int],
    page_size: int,
    parent_digest: bytes | None = None,
    namespace: str | None = None,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
) -> list[int]:
    """The event hash (signed int64) of every full page of ``token_ids``, chained from
    ``parent_digest`` (the 32-byte digest of the page before, None for a sequence's first
    page): plain, or namespaced by ``extra_key`` / ``cache_salt``. ``namespace`` is a cache
    salt given positionally (older callers)."""
    if namespace is not None:
        if cache_salt is not None:
            raise ValueError("give the cache salt once: namespace= or cache_salt=")
        cache_salt = namespace
    plain = [digest_to_int(d) for d in page_digests(token_ids, page_size, parent_digest)]
    return _in_namespace(plain, namespace_seed(extra_key, cache_salt))


def _in_namespace(plain: list[int], seed: bytes | None) -> list[int]:
    return plain if seed is None else [namespaced_hash(seed, h) for h in plain]
