"""Page hashes against the spec's definitions, computed here step by step with hashlib."""

from __future__ import annotations

import hashlib
import struct

import pytest

from schedkit.kv_events.hashing import namespace_seed, page_digests, page_hashes


def signed64(digest: bytes) -> int:
    return struct.unpack(">q", digest[:8])[0]


def test_plain_chain_per_spec():
    first = hashlib.sha256(struct.pack("<2I", 1, 2)).digest()
    second = hashlib.sha256(first + struct.pack("<2I", 3, 4)).digest()
    assert page_digests([1, 2, 3, 4, 5], 2) == [first, second]
    assert page_hashes([1, 2, 3, 4, 5], 2) == [signed64(first), signed64(second)]


def test_large_token_ids_and_signed_range():
    hashes = page_hashes([2**32 - 1] * 64, 1)
    assert all(-(2**63) <= h < 2**63 for h in hashes)
    assert any(h < 0 for h in hashes)


@pytest.mark.parametrize("bad", [[2**32], [-1], [1.5]])
def test_token_ids_out_of_range_are_refused(bad):
    with pytest.raises(ValueError, match=r"token ids must be integers in \[0, 4294967295\]"):
        page_hashes(bad, 1)


def namespaced_by_hand(tokens, page_size, extra_key, cache_salt):
    def field(value):
        if value is None:
            return b"\x00"
        raw = value.encode()
        return b"\x01" + struct.pack("<Q", len(raw)) + raw

    seed = hashlib.sha256(
        b"sglang-kv-event-namespace-v1" + field(extra_key) + field(cache_salt)
    ).digest()
    return [
        signed64(hashlib.sha256(seed + struct.pack(">q", h)).digest())
        for h in page_hashes(tokens, page_size)
    ]


@pytest.mark.parametrize(
    ("extra_key", "cache_salt"), [("lora-a", None), (None, "salt"), ("k", "s"), ("é", "")]
)
def test_namespaced_hashes_per_spec(extra_key, cache_salt):
    tokens = list(range(12))
    got = page_hashes(tokens, 4, extra_key=extra_key, cache_salt=cache_salt)
    assert got == namespaced_by_hand(tokens, 4, extra_key, cache_salt)
    assert got != page_hashes(tokens, 4)


def test_no_namespace_is_the_plain_chain():
    assert namespace_seed(None, None) is None
    assert page_hashes([1, 2], 1, extra_key=None, cache_salt=None) == page_hashes([1, 2], 1)


def test_extra_key_and_salt_are_not_interchangeable():
    assert page_hashes([1], 1, extra_key="a") != page_hashes([1], 1, cache_salt="a")
