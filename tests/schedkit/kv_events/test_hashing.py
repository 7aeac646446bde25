"""Page hashes against SGLang 0.5.23's definitions, computed here step by step with hashlib."""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
import subprocess
import sys
from array import array

import pytest

from schedkit.kv_events import hashing
from schedkit.kv_events.hashing import (
    namespace_seed,
    page_digests,
    page_hashes,
    published_page_hashes,
    salt_seed,
)
from schedkit.kv_events.page_chain import chain_ids_py, chain_packed_py


def signed64(digest: bytes) -> int:
    return struct.unpack(">q", digest[:8])[0]


def test_plain_chain_per_spec():
    first = hashlib.sha256(struct.pack("<2I", 1, 2)).digest()
    second = hashlib.sha256(first + struct.pack("<2I", 3, 4)).digest()
    assert page_digests([1, 2, 3, 4, 5], 2) == [first, second]
    assert page_hashes([1, 2, 3, 4, 5], 2) == [signed64(first), signed64(second)]


@pytest.mark.parametrize("native", [True, False])
def test_a_packed_prompt_hashes_as_its_list(native, monkeypatch):
    if not native:  # the pure-Python chain the package falls back to
        monkeypatch.setattr(hashing, "chain_packed", chain_packed_py)
        monkeypatch.setattr(hashing, "chain_ids", chain_ids_py)
    ids = [0, 1, 2**31, 2**32 - 1, 7, 9, 11]
    first = hashlib.sha256(struct.pack("<2I", *ids[:2])).digest()
    assert page_hashes(array("I", ids), 2)[0] == signed64(first)
    for salt, extra in [(None, None), ("s", None), ("s", "e")]:
        assert page_hashes(array("I", ids), 2, cache_salt=salt, extra_key=extra) == (
            page_hashes(ids, 2, cache_salt=salt, extra_key=extra)
        )


def test_large_token_ids_and_signed_range():
    hashes = page_hashes([2**32 - 1] * 64, 1)
    assert all(-(2**63) <= h < 2**63 for h in hashes)
    assert any(h < 0 for h in hashes)


def test_a_page_with_an_id_above_32_bits_takes_the_wide_encoding():
    # SGLang's native hash: a 0xff byte, then every id of that page as 8-byte little-endian.
    first = hashlib.sha256(struct.pack("<2I", 1, 2)).digest()
    wide = hashlib.sha256(first + b"\xff" + struct.pack("<2Q", 3, 2**32)).digest()
    third = hashlib.sha256(wide + struct.pack("<2I", 5, 6)).digest()
    assert page_digests([1, 2, 3, 2**32, 5, 6], 2) == [first, wide, third]
    top = hashlib.sha256(b"\xff" + struct.pack("<Q", 2**63 - 1)).digest()
    assert page_hashes([2**63 - 1], 1) == [signed64(top)]


@pytest.mark.parametrize("bad", [[2**63], [-1], [1.5], ["7"]])
def test_token_ids_out_of_range_are_refused(bad):
    with pytest.raises(
        ValueError, match=r"token ids must be integers in \[0, 9223372036854775807\]"
    ):
        page_hashes(bad, 1)


def test_unknown_hash_format_is_refused_with_the_valid_ones():
    with pytest.raises(
        ValueError, match="unknown KV-event hash format 'xxh3'; valid: sglang, dynamo"
    ):
        page_hashes([1], 1, hash_format="xxh3")


def test_salt_seed_is_sglangs_domain_separated_digest():
    assert salt_seed(None) is None
    assert salt_seed("tenant-a") == hashlib.sha256(b"sglang-cache-salt-v1\x00tenant-a").digest()
    assert salt_seed("é") == hashlib.sha256(b"sglang-cache-salt-v1\x00" + "é".encode()).digest()


def test_a_salted_chain_starts_from_the_salt_seed():
    seed = hashlib.sha256(b"sglang-cache-salt-v1\x00s").digest()
    first = hashlib.sha256(seed + struct.pack("<2I", 1, 2)).digest()
    second = hashlib.sha256(first + struct.pack("<2I", 3, 4)).digest()
    assert page_digests([1, 2, 3, 4], 2, cache_salt="s") == [first, second]
    assert page_hashes([1, 2, 3, 4], 2, cache_salt="s") == [signed64(first), signed64(second)]
    # A given parent digest continues its chain: the salt only seeds a sequence's first page.
    assert page_hashes([3, 4], 2, first, cache_salt="s") == [signed64(second)]


def test_extra_key_does_not_enter_the_default_format():
    assert page_hashes(list(range(8)), 4, extra_key="adapter") == page_hashes(list(range(8)), 4)
    assert published_page_hashes([1, 2], 1, "k", "s") == page_hashes([1, 2], 1, cache_salt="s")


def test_no_namespace_is_the_plain_chain_in_both_formats():
    assert namespace_seed(None, None) is None
    assert page_hashes([1, 2], 1, hash_format="dynamo") == page_hashes([1, 2], 1)


def vllm_by_hand(tokens, page_size, cache_salt=None):
    """vLLM 0.33's hash_block_tokens with its ``sha256`` (pickle, highest protocol), its
    NONE_HASH seeded from PYTHONHASHSEED or "vllm-none-hash", a salt tagged "cache_salt"."""

    def sha(obj):
        return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()

    parent, out = sha(os.environ.get("PYTHONHASHSEED", "vllm-none-hash")), []
    for start in range(0, len(tokens) - len(tokens) % page_size, page_size):
        extra = (("cache_salt", cache_salt),) if start == 0 and cache_salt else None
        parent = sha((parent, tuple(tokens[start : start + page_size]), extra))
        out.append(int.from_bytes(parent, "big") & (2**64 - 1))
    return out


@pytest.mark.parametrize("cache_salt", [None, "tenant-a"])
def test_vllm_sha256_format_is_vllms_block_hash(cache_salt):
    tokens = list(range(1, 12))
    want = vllm_by_hand(tokens, 4, cache_salt)
    assert page_hashes(tokens, 4, cache_salt=cache_salt, hash_format="vllm-sha256") == want


@pytest.mark.parametrize("seed", [None, "0"])
def test_vllm_none_hash_follows_pythonhashseed_as_vllm_does(seed):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    code = "from schedkit.kv_events.hashing import VLLM_NONE_HASH; print(VLLM_NONE_HASH.hex())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    want = pickle.dumps(seed or "vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL)
    assert out.stdout.strip() == hashlib.sha256(want).hexdigest()
