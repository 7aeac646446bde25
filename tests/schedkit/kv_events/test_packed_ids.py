"""Packed token ids encode as msgspec encodes the same ids as a list of ints, natively and not."""

from __future__ import annotations

import shutil
import sysconfig
from array import array
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedkit.kv_events import packed_ids
from schedkit.kv_events.structs import BlockStored, EventBatch, decode_batch, encode_batch

try:
    from schedkit.kv_events import _packed_ids as native
except ImportError:  # pragma: no cover - checked by test_the_extension_is_built_with_a_compiler
    native = None

# Each width's edges: fixint, uint 8, 16 and 32.
EDGES = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1]
IDS = st.lists(st.one_of(st.sampled_from(EDGES), st.integers(0, 2**32 - 1)), max_size=40)
encode = msgspec.msgpack.Encoder().encode


@settings(max_examples=60, deadline=None)
@given(ids=IDS)
def test_packed_ids_encode_to_the_bytes_of_their_list(ids):
    packed = array("I", ids)
    assert packed_ids.msgpack_u32_py(packed) == encode(ids)
    if native is not None:
        assert native.msgpack_u32(packed) == encode(ids)


@pytest.mark.parametrize("n", [15, 16, 65535, 65536])
def test_every_array_header_length_is_msgspecs(n):
    ids = [n % 300] * n
    assert packed_ids.msgpack_u32(array("I", ids)) == encode(ids)


def test_anything_but_packed_ids_is_refused():
    for wrong in (array("l", [1]), b"\x01\x00\x00\x00", [1]):
        with pytest.raises(TypeError, match="array\\('I'\\)"):
            packed_ids.msgpack_u32_py(wrong)
        if native is not None and not isinstance(wrong, list):
            with pytest.raises(TypeError, match="array\\('I'\\)"):
                native.msgpack_u32(wrong)
    with pytest.raises(TypeError, match="type object is unsupported"):
        encode_batch(EventBatch(0.0, [BlockStored([1], None, object(), 1, None)]))


@pytest.mark.parametrize("profile", ["sglang", "sglang-array", "vllm"])
def test_an_event_with_packed_ids_goes_out_as_with_a_list(profile):
    ids = [5, 300, 70000, 2**32 - 1]
    events = [BlockStored([7, 8], 3, ids, 2, None, "GPU")]
    as_list = encode_batch(EventBatch(1.0, events), profile)
    events[0].token_ids = array("I", ids)
    assert encode_batch(EventBatch(1.0, events), profile) == as_list
    assert decode_batch(as_list).events[0].token_ids == ids


def test_the_extension_is_built_with_a_compiler():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the pure-Python encoding is expected")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers: the pure-Python encoding is expected")
    assert native is not None and packed_ids.NATIVE
