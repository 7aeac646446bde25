"""Page hashes of a token sequence: SGLang 0.5.23's SHA-256 chain, one digest per page.

Page i's digest is SHA-256 over the previous page's 32-byte digest (absent for a sequence's first
page) followed by the page's token ids as 4-byte little-endian unsigned integers (a page with an
id above 2**32 - 1 takes SGLang's wide encoding, see ``page_chain``). Events carry the first 8
digest bytes read big-endian as a signed 64-bit integer.

A request with a ``cache_salt`` starts its chain from ``SHA-256(b"sglang-cache-salt-v1\\0" +
UTF-8 salt)`` instead of from nothing (SGLang's ``compute_node_event_hash_values``); an
``extra_key`` does not enter the chain. Two hash formats publish that chain:

- ``sglang`` (SGLang's default): the chain's hashes as they are;
- ``dynamo``: a request with a namespace (``extra_key`` and / or ``cache_salt``) publishes the
  same (salted) chain namespaced by ``seed = SHA-256(b"sglang-kv-event-namespace-v1" +
  field(extra_key) + field(cache_salt))``, where an absent field is ``b"\\x00"`` and a present
  one ``b"\\x01"`` + its UTF-8 length as 8-byte little-endian + the UTF-8 bytes: the published
  hash of a page is the signed first 8 bytes of ``SHA-256(seed + hash as 8-byte big-endian
  signed)``. Requests without a namespace publish the chain as is in both formats;
- ``vllm-sha256``: vLLM 0.33's own chain with its ``sha256`` hash function
  (``vllm_page_digests``), seeded as vLLM seeds it (``PYTHONHASHSEED`` when set, else
  ``"vllm-none-hash"``) and published as vLLM publishes it (low 64 bits, unsigned). It costs
  several times SGLang's chain (a pickle per page); the ``vllm`` wire profile carries
  SGLang-style values unless a cache selects this format.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from array import array
from collections.abc import Sequence

from schedkit.kv_events.page_chain import MAX_HASHABLE_TOKEN_ID, chain_ids, chain_packed

__all__ = [
    "HASH_FORMATS",
    "MAX_HASHABLE_TOKEN_ID",
    "VLLM_DEFAULT_NONE_HASH_SEED",
    "VLLM_NONE_HASH",
    "check_hash_format",
    "digest_to_int",
    "namespace_seed",
    "namespaced_hash",
    "page_digests",
    "page_hashes",
    "published_page_hashes",
    "salt_seed",
    "vllm_digest_to_int",
    "vllm_none_hash",
    "vllm_page_digests",
]

HASH_FORMATS = ("sglang", "dynamo", "vllm-sha256")
# vLLM's seed of a sequence's first-block parent when PYTHONHASHSEED is not set (sha256 family).
VLLM_DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def vllm_none_hash(seed: str) -> bytes:
    """vLLM's ``NONE_HASH`` (the first block's parent) for ``seed`` under its ``sha256``."""
    return hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()


# Resolved as vLLM's ``resolve_none_hash_seed`` does for ``sha256``, so that a schedkit run and a
# vLLM started in the same environment agree.
VLLM_NONE_HASH = vllm_none_hash(os.environ.get("PYTHONHASHSEED", VLLM_DEFAULT_NONE_HASH_SEED))
_sha256 = hashlib.sha256
_SALT_TAG = b"sglang-cache-salt-v1\0"
_NAMESPACE_TAG = b"sglang-kv-event-namespace-v1"


def salt_seed(cache_salt: str | None) -> bytes | None:
    """The 32-byte digest a salted request's chain starts from; None without a salt."""
    if cache_salt is None:
        return None
    return _sha256(_SALT_TAG + cache_salt.encode("utf-8")).digest()


def namespace_seed(extra_key: str | None = None, cache_salt: str | None = None) -> bytes | None:
    """The 32-byte seed of the ``dynamo`` hash format; None when there is no namespace."""
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


def namespaced_hash(seed: bytes, chain_hash: int) -> int:
    """The ``dynamo``-format hash of a page whose chain hash is ``chain_hash``, under ``seed``."""
    digest = _sha256(seed + chain_hash.to_bytes(8, "big", signed=True)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def digest_to_int(digest: bytes) -> int:
    """The signed 64-bit integer that events carry for a page digest."""
    return int.from_bytes(digest[:8], "big", signed=True)


def check_hash_format(hash_format: str) -> None:
    """Raise ValueError naming the valid formats unless ``hash_format`` is one of them."""
    if hash_format not in HASH_FORMATS:
        raise ValueError(
            f"unknown KV-event hash format {hash_format!r}; valid: {', '.join(HASH_FORMATS)}"
        )


def vllm_page_digests(
    token_ids: Sequence[int],
    page_size: int,
    parent_digest: bytes | None = None,
    *,
    cache_salt: str | None = None,
) -> list[bytes]:
    """vLLM's ``sha256`` block hashes of every full page: SHA-256 of the pickled tuple
    ``(parent digest, page token ids, extra keys)`` (highest pickle protocol), the first page's
    parent being ``VLLM_NONE_HASH`` and its extra keys ``(("cache_salt", cache_salt),)`` (None
    otherwise), as vLLM 0.33's ``generate_block_hash_extra_keys`` tags a salt."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    prev = parent_digest if parent_digest else VLLM_NONE_HASH
    first = (("cache_salt", cache_salt),) if parent_digest is None and cache_salt else None
    out = []
    for start in range(0, len(token_ids) - len(token_ids) % page_size, page_size):
        page = tuple(token_ids[start : start + page_size])
        extra = first if start == 0 else None
        prev = _sha256(pickle.dumps((prev, page, extra), protocol=pickle.HIGHEST_PROTOCOL)).digest()
        out.append(prev)
    return out


def vllm_digest_to_int(digest: bytes) -> int:
    """The integer vLLM's events carry for a block hash (its low 64 bits, unsigned)."""
    return int.from_bytes(digest, "big") & 0xFFFFFFFFFFFFFFFF


def page_digests(
    token_ids: Sequence[int],
    page_size: int,
    parent_digest: bytes | None = None,
    *,
    cache_salt: str | None = None,
) -> list[bytes]:
    """The 32-byte digests of every full page of ``token_ids``, chained from ``parent_digest``
    (for a sequence's first page: nothing, or the salt's seed when ``cache_salt`` is given).

    A trailing partial page is not hashed.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    prior = parent_digest
    if prior is None:
        prior = salt_seed(cache_salt) or b""
    joined = chain_ids(prior, token_ids, page_size)
    return [joined[i : i + 32] for i in range(0, len(joined), 32)]


def _chain_hashes(
    token_ids: Sequence[int], page_size: int, parent_digest: bytes | None, cache_salt: str | None
) -> list[int]:
    """``digest_to_int`` of every ``page_digests`` digest, read straight from the chain's
    joined digests (the first 8 bytes of each 32, big-endian, signed)."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    prior = parent_digest
    if prior is None:
        prior = salt_seed(cache_salt) or b""
    if isinstance(token_ids, array) and token_ids.typecode == "I":
        # A packed prompt (4 bytes a token, each below 2**32: the narrow encoding) is
        # already the chain's page bytes on a little-endian machine: no int per token.
        raw = token_ids
        if sys.byteorder != "little":
            raw = array("I", token_ids)
            raw.byteswap()
        words = array("q", chain_packed(prior, raw.tobytes(), 4 * page_size))
    else:
        words = array("q", chain_ids(prior, token_ids, page_size))
    if sys.byteorder == "little":
        words.byteswap()
    return words[::4].tolist()


def published_page_hashes(
    token_ids: Sequence[int],
    page_size: int,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    hash_format: str = "sglang",
) -> list[int]:
    """The hash a cache publishes for every full page of ``token_ids`` (a sequence from its
    first page) in the namespace ``(extra_key, cache_salt)``: what a router matches against."""
    return page_hashes(
        token_ids, page_size, extra_key=extra_key, cache_salt=cache_salt, hash_format=hash_format
    )


def page_hashes(
    token_ids: Sequence[int],
    page_size: int,
    parent_digest: bytes | None = None,
    namespace: str | None = None,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    hash_format: str = "sglang",
) -> list[int]:
    """The event hash (signed int64) of every full page of ``token_ids``, chained from
    ``parent_digest`` (the 32-byte digest of the page before, None for a sequence's first
    page), for a request with ``extra_key`` / ``cache_salt`` in ``hash_format`` (see the module
    docstring). ``namespace`` is a cache salt given positionally (older callers)."""
    check_hash_format(hash_format)
    if namespace is not None:
        if cache_salt is not None:
            raise ValueError("give the cache salt once: namespace= or cache_salt=")
        cache_salt = namespace
    if hash_format == "vllm-sha256":
        digests = vllm_page_digests(token_ids, page_size, parent_digest, cache_salt=cache_salt)
        return [vllm_digest_to_int(d) for d in digests]
    hashes = _chain_hashes(token_ids, page_size, parent_digest, cache_salt)
    if hash_format == "dynamo":
        seed = namespace_seed(extra_key, cache_salt)
        if seed is not None:
            hashes = [namespaced_hash(seed, h) for h in hashes]
    return hashes
