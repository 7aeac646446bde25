"""Page hashes of a token sequence: a SHA-256 chain, one digest per page.

Page i's digest is SHA-256 over the previous page's 32-byte digest (absent for a sequence's first
page, or the namespace seed when one is given) followed by the page's token ids as 4-byte
little-endian unsigned integers. Events carry the first 8 digest bytes read big-endian as a
signed 64-bit integer.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence

__all__ = ["digest_to_int", "namespace_seed", "page_digests", "page_hashes"]

_sha256 = hashlib.sha256
_SWAP = sys.byteorder != "little"


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    try:
        packed = array("I", token_ids)
    except OverflowError:
        raise ValueError("token ids must be integers in [0, 2**32)") from None
    if packed.itemsize != 4:  # pragma: no cover - platforms where C int is not 32-bit
        packed = array("L", token_ids)
    if _SWAP:  # pragma: no cover - big-endian hosts
        packed.byteswap()
    return packed.tobytes()


def namespace_seed(namespace: str | None) -> bytes | None:
    """The digest that stands before the first page of a namespaced (LoRA / salted) sequence."""
    if namespace is None:
        return None
    return _sha256(namespace.encode()).digest()


def digest_to_int(digest: bytes) -> int:
    """The signed 64-bit integer that events carry for a page digest."""
    return int.from_bytes(digest[:8], "big", signed=True)


def page_digests(
    token_ids: Sequence[int],
    page_size: int,
    parent_digest: bytes | None = None,
    namespace: str | None = None,
) -> list[bytes]:
    """The 32-byte digests of every full page of ``token_ids``, chained from ``parent_digest``.

    ``namespace`` seeds the chain only when there is no parent (a sequence's first page).
    A trailing partial page is not hashed.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if parent_digest is None:
        parent_digest = namespace_seed(namespace)
    raw = _token_bytes(token_ids)
    step = 4 * page_size
    end = (len(token_ids) // page_size) * step
    digests = []
    prev = parent_digest if parent_digest is not None else b""
    for start in range(0, end, step):
        prev = _sha256(prev + raw[start : start + step]).digest()
        digests.append(prev)
    return digests


def page_hashes(
    token_ids: Sequence[int],
    page_size: int,
    parent_hash: bytes | None = None,
    namespace: str | None = None,
) -> list[int]:
    """The event hash (signed int64) of every full page of ``token_ids``.

    ``parent_hash`` is the 32-byte digest of the page before ``token_ids[0]`` (see
    ``page_digests``); ``None`` starts a new sequence.
    """
    return [
        int.from_bytes(d[:8], "big", signed=True)
        for d in page_digests(token_ids, page_size, parent_hash, namespace)
    ]
