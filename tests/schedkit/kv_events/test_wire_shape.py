"""shape_problems against what each engine's own declarations encode: every engine's payload
is its profile and no other, and the reason names the place."""

from __future__ import annotations

import msgspec
import pytest

from schedkit.kv_events import PROFILES
from schedkit.kv_events.wire_shape import shape_problems
from tests.schedkit.kv_events import engine_structs as engine

STORED = ([5, -7], None, [1, 2, 3, 4], 2, None)

ENGINE_BATCHES = {
    "sglang": engine.KVEventBatch(
        1.5,
        [
            engine.BlockStored(*STORED, medium="GPU"),
            engine.BlockRemoved([5]),
            engine.AllBlocksCleared(),
        ],
        0,
    ),
    "sglang-array": engine.ArrayBatch(
        1.5,
        [
            engine.ArrayBlockStored(*STORED, "GPU"),
            engine.ArrayBlockRemoved([5]),
            engine.ArrayAllBlocksCleared(),
        ],
        0,
    ),
    "vllm": engine.VllmBatch(
        1.5,
        [
            engine.VllmBlockStored(*STORED, "GPU", None),
            engine.VllmBlockRemoved([5], None),
            engine.VllmAllBlocksCleared(),
        ],
        0,
    ),
}


@pytest.mark.parametrize("profile", PROFILES)
def test_each_engines_payload_is_its_profile_only(profile):
    problems = shape_problems(msgspec.msgpack.encode(ENGINE_BATCHES[profile]))
    assert [name for name, problem in problems.items() if problem is None] == [profile]


def test_the_reason_names_the_place_and_the_field():
    vllm = shape_problems(msgspec.msgpack.encode(ENGINE_BATCHES["vllm"]))
    assert vllm["sglang"] == "$[1][0] has 'lora_name': None, which sglang leaves out"
    sglang = shape_problems(msgspec.msgpack.encode(ENGINE_BATCHES["sglang"]))
    assert sglang["vllm"] == (
        "does not decode with vllm's declarations: Object missing required field `lora_name` "
        "- at `$[1][0]`"
    )
    array = shape_problems(msgspec.msgpack.encode(ENGINE_BATCHES["sglang-array"]))
    assert array["sglang"].endswith("Expected `object`, got `array` - at `$[1][0]`")


def test_a_batch_without_its_optional_rank_is_still_the_engines():
    batch = engine.ArrayBatch(1.5, [engine.ArrayAllBlocksCleared()])
    payload = msgspec.msgpack.encode(batch)  # omit_defaults: [ts, events]
    assert shape_problems(payload)["sglang-array"] is None


def test_extra_fields_and_other_values_are_named():
    event = {"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU", "extra": 1}
    payload = msgspec.msgpack.encode([1.0, [event], 0])
    assert shape_problems(payload)["sglang"] == "$[1][0] has 'extra': 1, which sglang leaves out"
    assert shape_problems(b"\xc1")["vllm"].startswith("not msgpack (")
