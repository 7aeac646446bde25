"""Published page hashes against SGLang 0.5.23's published values and the byte layouts of its
``compute_node_event_hash_values``, computed here from hashlib directly."""

import hashlib
import struct

import pytest

from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.cache.tree_node import RadixKey
from schedkit.kv_events import BlockStored
from schedkit.kv_events.hashing import namespace_seed, page_hashes, published_page_hashes

# SGLang 0.5.23's published hashes of RadixKey([1..8], extra_key=None, cache_salt="tenant-a")
# at page size 4, default hash format.
SGLANG_TENANT_A = [3718046898735569995, 3308615664605479373]


def chain(tokens, page_size, prior=b""):
    prev, out = prior, []
    for i in range(0, len(tokens) - len(tokens) % page_size, page_size):
        page = tokens[i : i + page_size]
        prev = hashlib.sha256(prev + struct.pack(f"<{len(page)}I", *page)).digest()
        out.append(struct.unpack(">q", prev[:8])[0])
    return out


def salted(tokens, page_size, salt):
    prior = hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode("utf-8")).digest()
    return chain(tokens, page_size, prior)


def dynamo_seed(extra_key, cache_salt):
    data = b"sglang-kv-event-namespace-v1"
    for field in (extra_key, cache_salt):
        if field is None:
            data += b"\x00"
        else:
            raw = field.encode("utf-8")
            data += b"\x01" + struct.pack("<Q", len(raw)) + raw
    return hashlib.sha256(data).digest()


def namespaced(seed_bytes, h):
    digest = hashlib.sha256(seed_bytes + struct.pack(">q", h)).digest()
    return struct.unpack(">q", digest[:8])[0]


def test_salted_hashes_are_sglangs_published_values():
    tokens = list(range(1, 9))
    assert published_page_hashes(tokens, 4, None, "tenant-a") == SGLANG_TENANT_A
    assert salted(tokens, 4, "tenant-a") == SGLANG_TENANT_A
    cache = RadixCache(page_size=4, capacity=64, enable_kv_cache_events=True)
    cache.insert(RadixKey(tokens, None, "tenant-a"))
    events = [e for e in cache.take_events() if type(e) is BlockStored]
    assert events == [BlockStored(SGLANG_TENANT_A, None, tokens, 4, None, "GPU", "tenant-a")]


@pytest.mark.parametrize("page_size", [1, 2, 16])
def test_plain_hashes_are_the_chained_sha256_of_little_endian_tokens(page_size):
    tokens = [0, 1, 2**32 - 1, 31999, 7, 8, 9] * 5
    assert page_hashes(tokens, page_size) == chain(tokens, page_size)
    assert published_page_hashes(tokens, page_size) == chain(tokens, page_size)


@pytest.mark.parametrize(
    ("extra_key", "cache_salt"), [("lora-a", None), (None, "salt"), ("k", "s"), ("", "é")]
)
def test_default_format_publishes_the_salted_chain_as_is(extra_key, cache_salt):
    tokens = list(range(100, 140))
    expected = chain(tokens, 4) if cache_salt is None else salted(tokens, 4, cache_salt)
    assert published_page_hashes(tokens, 4, extra_key, cache_salt) == expected


@pytest.mark.parametrize(
    ("extra_key", "cache_salt"), [("lora-a", None), (None, "salt"), ("k", "s"), ("", "é")]
)
def test_dynamo_format_namespaces_the_same_salted_chain(extra_key, cache_salt):
    tokens = list(range(100, 140))
    base = chain(tokens, 4) if cache_salt is None else salted(tokens, 4, cache_salt)
    seed = dynamo_seed(extra_key, cache_salt)
    expected = [namespaced(seed, h) for h in base]
    assert published_page_hashes(tokens, 4, extra_key, cache_salt, "dynamo") == expected
    assert namespace_seed(extra_key, cache_salt) == seed


def test_namespaces_never_collide_in_the_dynamo_format():
    tokens = [1, 2, 3, 4]
    variants = [(None, None), ("", None), (None, ""), ("a", None), (None, "a"), ("a", "a")]
    first_pages = {published_page_hashes(tokens, 2, *v, "dynamo")[0] for v in variants}
    assert len(first_pages) == len(variants)


def test_page_hashes_takes_the_namespace_by_keyword_and_the_parent_digest():
    tokens = [5, 6, 7, 8]
    assert page_hashes(tokens, 2, extra_key="k", cache_salt="s") == published_page_hashes(
        tokens, 2, "k", "s"
    )
    assert page_hashes(tokens, 2, None, "s") == page_hashes(tokens, 2, cache_salt="s")
    with pytest.raises(ValueError, match="give the cache salt once"):
        page_hashes(tokens, 2, None, "s", cache_salt="s")
