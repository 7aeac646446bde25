"""The native page chain against the pure-Python one and hashlib, on random inputs."""

from __future__ import annotations

import hashlib
import random
import shutil
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from schedkit.components.cache.event_recorder import EventRecorder
from schedkit.kv_events import page_chain

try:
    from schedkit.kv_events import _page_chain as native
except ImportError:  # pragma: no cover - checked by test_the_extension_is_built_with_a_compiler
    native = None

needs_native = pytest.mark.skipif(native is None, reason="the C extension is not built")


def hashlib_chain(prior: bytes, ids: list[int], page_size: int) -> bytes:
    out, prev = [], prior
    for start in range(0, len(ids) - len(ids) % page_size, page_size):
        page = ids[start : start + page_size]
        if max(page) > 2**32 - 1:
            data = b"\xff" + struct.pack(f"<{len(page)}Q", *page)
        else:
            data = struct.pack(f"<{len(page)}I", *page)
        prev = hashlib.sha256(prev + data).digest()
        out.append(prev)
    return b"".join(out)


def random_case(rng: random.Random, i: int):
    page_size = rng.choice([1, 2, 3, 4, 15, 16, 17, 64, 256])
    n = rng.randrange(0, 5) * page_size + rng.randrange(0, 3)
    ids = [
        rng.randrange(0, 2**63) if rng.random() < 0.03 else rng.randrange(0, 2**32)
        for _ in range(n)
    ]
    prior = rng.choice([b"", hashlib.sha256(str(i).encode()).digest()])
    return prior, ids, page_size


def test_python_chain_matches_hashlib():
    rng = random.Random(7)
    for i in range(300):
        prior, ids, page_size = random_case(rng, i)
        assert page_chain.chain_ids_py(prior, ids, page_size) == hashlib_chain(
            prior, ids, page_size
        )


@needs_native
@pytest.mark.parametrize("portable", [False, True])
def test_native_chain_is_byte_identical_to_python(portable):
    rng = random.Random(11)
    native.use_portable(portable)
    try:
        for i in range(1500):
            prior, ids, page_size = random_case(rng, i)
            want = page_chain.chain_ids_py(prior, ids, page_size)
            assert native.chain_ids(prior, ids, page_size) == want
            raw = rng.randbytes(rng.randrange(0, 700))
            page_bytes = rng.randrange(1, 300)
            assert native.chain_packed(prior, raw, page_bytes) == page_chain.chain_packed_py(
                prior, raw, page_bytes
            )
            packed = native.pack_u32(ids)
            assert packed == (
                None if ids and max(ids) > 2**32 - 1 else struct.pack(f"<{len(ids)}I", *ids)
            )
    finally:
        native.use_portable(False)


@pytest.mark.parametrize("impl", ["python", pytest.param("native", marks=needs_native)])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((b"", [1, -1], 1), r"token ids must be integers in \[0, 9223372036854775807\]"),
        ((b"", [2**63], 1), r"token ids must be integers in \[0, 9223372036854775807\]"),
        ((b"", [True], 1), r"token ids must be integers in \[0, 9223372036854775807\]"),
        ((b"", [1.0], 1), r"token ids must be integers in \[0, 9223372036854775807\]"),
        ((b"x" * 31, [1], 1), "the prior digest must be empty or 32 bytes, got 31"),
        ((b"", [1], 0), "page_size must be >= 1, got 0"),
    ],
)
def test_both_chains_refuse_the_same_input_alike(impl, args, message):
    chain_ids = page_chain.chain_ids_py if impl == "python" else native.chain_ids
    with pytest.raises(ValueError, match=message):
        chain_ids(*args)


@needs_native
@pytest.mark.parametrize(
    ("ids", "packed"),
    [
        ((7, 2**32 - 1), b"\x07\x00\x00\x00\xff\xff\xff\xff"),
        ([], b""),
        ([1, -1], None),
        ([2**32], None),
        ([2**80], None),
        ([True], None),  # left to the caller's packing, which takes it as struct does
        ([1.0], None),
        (range(3), None),
    ],
)
def test_native_packing_takes_only_plain_ids_in_range(ids, packed):
    assert native.pack_u32(ids) == packed
    assert EventRecorder(1).pack([True, 2]) == struct.pack("<2I", 1, 2)


def test_the_extension_is_built_with_a_compiler():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the pure-Python chain is expected")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers: the pure-Python chain is expected")
    assert native is not None and page_chain.NATIVE
    assert page_chain.implementation().startswith("native")


def test_without_the_extension_the_cache_publishes_the_same_hashes():
    script = (
        "import sys; sys.modules['schedkit.kv_events._page_chain'] = None\n"
        "from schedkit.kv_events import page_chain\n"
        "from schedkit.components.cache.radix_cache import RadixCache\n"
        "from schedkit.components.cache.tree_node import RadixKey\n"
        "c = RadixCache(page_size=4, capacity=64, enable_kv_cache_events=True)\n"
        "c.insert(RadixKey(list(range(1, 9)), None, 'tenant-a'))\n"
        "c.insert([1, 2, 3, 4, 2**40, 6, 7, 8])\n"
        "print(page_chain.implementation(), [e.block_hashes for e in c.take_events()[1:]])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    from schedkit.kv_events.hashing import page_hashes

    want = [
        [3718046898735569995, 3308615664605479373],
        page_hashes([1, 2, 3, 4, 2**40, 6, 7, 8], 4),
    ]
    assert out.strip() == f"python {want}"
