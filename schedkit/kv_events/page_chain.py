"""SGLang's SHA-256 page chain, computed natively when the C extension was built.

A page's digest is SHA-256 over the previous page's 32-byte digest (nothing for a chain's first
page) and the page's token ids as 4-byte little-endian unsigned integers. A page holding an id
above 2**32 - 1 is hashed in SGLang's wide encoding instead: one ``0xff`` byte, then every id of
the page as an 8-byte little-endian unsigned integer (ids up to 2**63 - 1).

``chain_packed(prior, raw, page_bytes)`` chains pages of already packed 4-byte ids and
``chain_ids(prior, token_ids, page_size)`` packs the ids itself (taking the wide encoding where
a page needs it); both return the digests of every full page end to end (32 bytes each) in one
call. ``pack_u32(token_ids)`` packs a list or tuple of plain ints in [0, 2**32 - 1] for
``chain_packed`` in one native loop, and returns None for anything else (a bool included),
which the caller packs its own way; it is None without the extension. ``NATIVE`` says whether
the C extension ``schedkit.kv_events._page_chain`` (built by ``pip install`` from
``_page_chain.c`` when a C compiler is present) is in use; ``chain_packed_py`` and
``chain_ids_py`` are the pure-Python versions it falls back to.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from struct import Struct

__all__ = [
    "MAX_HASHABLE_TOKEN_ID",
    "NATIVE",
    "chain_ids",
    "chain_ids_py",
    "chain_packed",
    "chain_packed_py",
    "implementation",
    "pack_u32",
]

MAX_HASHABLE_TOKEN_ID = 2**63 - 1
_U32 = 2**32 - 1
_sha256 = hashlib.sha256
_RANGE_ERROR = f"token ids must be integers in [0, {MAX_HASHABLE_TOKEN_ID}]"


def _check_prior(prior: bytes) -> None:
    if len(prior) not in (0, 32):
        raise ValueError(f"the prior digest must be empty or 32 bytes, got {len(prior)}")


def chain_packed_py(prior: bytes, raw: bytes, page_bytes: int) -> bytes:
    """The chained digests of every full ``page_bytes`` page of ``raw`` (pure Python)."""
    _check_prior(prior)
    if page_bytes < 1:
        raise ValueError(f"page_bytes must be >= 1, got {page_bytes}")
    out = []
    prev = bytes(prior)
    end = len(raw) - len(raw) % page_bytes
    for start in range(0, end, page_bytes):
        prev = _sha256(prev + raw[start : start + page_bytes]).digest()
        out.append(prev)
    return b"".join(out)


def _page_input(page: Sequence[int]) -> bytes:
    """One page's hash input after the prior digest: 4-byte ids, or SGLang's wide encoding
    (the ids are already checked to lie in [0, MAX_HASHABLE_TOKEN_ID])."""
    if max(page) <= _U32:
        return Struct(f"<{len(page)}I").pack(*page)
    return b"\xff" + Struct(f"<{len(page)}Q").pack(*page)


def chain_ids_py(prior: bytes, token_ids: Sequence[int], page_size: int) -> bytes:
    """The chained digests of every full page of ``token_ids`` (pure Python)."""
    _check_prior(prior)
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    for t in token_ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_HASHABLE_TOKEN_ID:
            raise ValueError(_RANGE_ERROR)
    out = []
    prev = bytes(prior)
    end = len(token_ids) - len(token_ids) % page_size
    for start in range(0, end, page_size):
        prev = _sha256(prev + _page_input(token_ids[start : start + page_size])).digest()
        out.append(prev)
    return b"".join(out)


def implementation() -> str:
    """Which chain is in use: ``native (sha-ni)``, ``native (portable)`` or ``python``."""
    if _native is None:
        return "python"
    return f"native ({_native.implementation()})"


try:
    from schedkit.kv_events import _page_chain as _native
except ImportError:  # the C extension was not built: same results, slower
    _native = None

if _native is None:
    chain_ids = chain_ids_py
    chain_packed = chain_packed_py
    pack_u32: Callable[[Sequence[int]], bytes | None] | None = None
    NATIVE = False
elif _native.implementation() == "sha-ni":
    chain_ids = _native.chain_ids
    chain_packed = _native.chain_packed
    pack_u32 = getattr(_native, "pack_u32", None)  # None from a build older than pack_u32
    NATIVE = True
else:
    # Without the CPU's SHA instructions the portable C compression beats hashlib's only on
    # short pages (per-call overhead dominates); longer pages go to hashlib.
    _native_ids, _native_packed = _native.chain_ids, _native.chain_packed

    def chain_packed(prior: bytes, raw: bytes, page_bytes: int) -> bytes:
        """``chain_packed_py``'s result, natively for pages of up to 64 bytes."""
        if page_bytes <= 64:
            return _native_packed(prior, raw, page_bytes)
        return chain_packed_py(prior, raw, page_bytes)

    def chain_ids(prior: bytes, token_ids: Sequence[int], page_size: int) -> bytes:
        """``chain_ids_py``'s result, natively for pages of up to 16 ids."""
        if page_size <= 16:
            return _native_ids(prior, token_ids, page_size)
        return chain_ids_py(prior, token_ids, page_size)

    pack_u32 = getattr(_native, "pack_u32", None)  # None from a build older than pack_u32
    NATIVE = True
