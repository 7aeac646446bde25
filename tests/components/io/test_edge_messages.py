"""edge_messages.leading_kind_and_rid: the kind and rid from a message's first bytes agree with
the whole-message decode whenever it answers, and it declines (None) whatever it cannot read
from the front."""

from __future__ import annotations

import msgspec
import pytest

from schedkit.components.io.edge_messages import leading_kind_and_rid
from schedkit.components.io.io_struct import (
    ControlReq,
    GenerateReqInput,
    encode,
    kind_and_rid,
)


@pytest.mark.parametrize(
    "message",
    [
        encode(GenerateReqInput(rid="r1", input_ids=list(range(40_000)))),
        msgspec.msgpack.encode({"rid": "é" * 40, "kind": "generate", "input_ids": [1]}),  # str 8
        msgspec.msgpack.encode({"kind": "generate", "rid": "x" * 256, "input_ids": [1]}),  # str 16
        msgspec.msgpack.encode({"kind": "generate", "rid": "r", **{f"k{i}": i for i in range(20)}}),
    ],
)
def test_it_reads_what_the_whole_decode_reads(message):
    assert leading_kind_and_rid(message) == kind_and_rid(message)
    assert leading_kind_and_rid(message)[0] == "generate"


@pytest.mark.parametrize(
    "message",
    [
        msgspec.msgpack.encode({"kind": "generate", "input_ids": [1], "rid": "late"}),
        encode(ControlReq(type="abort", rid="r2")),  # its rid comes third
        msgspec.msgpack.encode({"kind": "generate", "rid": "x" * 257}),  # over the rid bound
        msgspec.msgpack.encode({"kind": "generate", "rid": 7}),
        msgspec.msgpack.encode({"kind": "generate"}),
        msgspec.msgpack.encode(["generate", "r"]),
        b"\x82\xa4kind\xa8generate\xa3rid\xa2\xff\xfe",  # invalid UTF-8
        b"\x82\xa4kind\xa8generate\xa3rid\xa5ab",  # cut short
        b"",
    ],
)
def test_it_declines_what_it_cannot_read_from_the_front(message):
    assert leading_kind_and_rid(message) is None
