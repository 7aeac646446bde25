"""Page hashes against the byte layout the spec gives, computed here from hashlib directly."""

import hashlib
import struct

import pytest

from schedkit.kv_events.hashing import (
    namespace_seed,
    page_digests,
    page_hashes,
    published_page_hashes,
)


def plain_chain(tokens, page_size):
    prev, out = b"", []
    for i in range(0, len(tokens) - len(tokens) % page_size, page_size):
        page = tokens[i : i + page_size]
        prev = hashlib.sha256(prev + struct.pack(f"<{len(page)}I", *page)).digest()
        out.append(struct.unpack(">q", prev[:8])[0])
    return out


def seed(extra_key, cache_salt):
    data = b"sglang-kv-event-namespace-v1"
    for field in (extra_key, cache_salt):
        if field is None:
            data += b"\x00"
        else:
            raw = field.encode("utf-8")
            data += b"\x01" + struct.pack("<Q", len(raw)) + raw
    return hashlib.sha256(data).digest()


def namespaced(seed_bytes, plain):
    return struct.unpack(">q", hashlib.sha256(seed_bytes + struct.pack(">q", plain)).digest()[:8])[
        0
    ]


@pytest.mark.parametrize("page_size", [1, 2, 16])
def test_plain_hashes_are_the_chained_sha256_of_little_endian_tokens(page_size):
    tokens = [0, 1, 2**32 - 1, 31999, 7, 8, 9] * 5
    assert page_hashes(tokens, page_size) == plain_chain(tokens, page_size)
    assert published_page_hashes(tokens, page_size) == plain_chain(tokens, page_size)


@pytest.mark.parametrize(
    ("extra_key", "cache_salt"), [("lora-a", None), (None, "salt"), ("k", "s"), ("", "é")]
)
def test_namespaced_hashes_follow_the_sglang_layout(extra_key, cache_salt):
    tokens = list(range(100, 140))
    expected = [namespaced(seed(extra_key, cache_salt), h) for h in plain_chain(tokens, 4)]
    assert published_page_hashes(tokens, 4, extra_key, cache_salt) == expected
    assert namespace_seed(extra_key, cache_salt) == seed(extra_key, cache_salt)


def test_no_namespace_has_no_seed_and_the_chain_itself_is_never_seeded():
    assert namespace_seed(None, None) is None
    tokens = [1, 2, 3, 4]
    digests = page_digests(tokens, 2)
    assert [struct.unpack(">q", d[:8])[0] for d in digests] == plain_chain(tokens, 2)
    # Different namespaces (and the empty string against absence) never collide.
    variants = [(None, None), ("", None), (None, ""), ("a", None), (None, "a"), ("a", "a")]
    first_pages = {published_page_hashes(tokens, 2, *v)[0] for v in variants}
    assert len(first_pages) == len(variants)


@pytest.mark.parametrize("bad", [[2**32], [-1], [1.5]])
def test_token_ids_outside_32_bits_are_rejected(bad):
    with pytest.raises(ValueError, match=r"token ids must be integers in \[0, 4294967295\]"):
        page_hashes(bad, 1)


def test_page_hashes_takes_the_namespace_by_keyword_and_the_parent_digest():
    tokens = [5, 6, 7, 8]
    assert page_hashes(tokens, 2, extra_key="k", cache_salt="s") == published_page_hashes(
        tokens, 2, "k", "s"
    )
    first = page_digests(tokens[:2], 2)[0]
    assert page_hashes(tokens[2:], 2, first) == page_hashes(tokens, 2)[1:]
