"""Trace files read by ``open_trace``: every format from a real small file, shared hash ids as
shared token prefixes, speedup, capping, bad lines reported briefly, and flat memory."""

from __future__ import annotations

import json
import math
import tracemalloc
from array import array
from pathlib import Path

import pytest

from schedkit.workloads.trace_tokens import hash_id_tokens, text_tokens
from schedkit.workloads.traces import guess_format, open_trace, write_mooncake_like
from schedkit.workloads.workload import WorkloadError

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "examples" / "traces" / "mooncake_sample.jsonl"


def mooncake_line(timestamp: int, input_length: int, hash_ids: list[int], output: int = 8) -> str:
    row = {"timestamp": timestamp, "input_length": input_length, "output_length": output}
    return json.dumps({**row, "hash_ids": hash_ids}) + "\n"


def test_mooncake_hash_ids_become_shared_token_blocks(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(
        mooncake_line(1000, 1100, [0, 1, 2], output=20)
        + mooncake_line(1500, 600, [0, 3])
        + mooncake_line(4000, 1024, [0, 1])
    )
    workload = open_trace(path, "mooncake")
    assert workload.num_requests == 3 and workload.notes == []
    first, second, third = workload.initial()
    assert [a.time for a in (first, second, third)] == [0.0, 0.5, 3.0]  # offsets from the first
    a, b, c = (x.req.origin_input_ids.tolist() for x in (first, second, third))
    assert len(a) == 1100 and len(b) == 600 and len(c) == 1024
    assert a[:512] == b[:512] == c[:512] == [0] * 512  # Dynamo: hash id h is [h] * block
    assert a[512:1024] == c[512:1024] == [1] * 512 and b[512:] == [3] * 88
    assert a[1024:] == [2] * 76  # the last block cut to input_length
    assert first.req.sampling_params.max_new_tokens == 20
    assert first.req.sampling_params.ignore_eos and first.req.rid == "line1"


def test_mooncake_block_size_speedup_and_cap(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(mooncake_line(t * 1000, 40, [9, t]) for t in range(10)))
    workload = open_trace(path, "mooncake", block_size=32, speedup=4.0, num_requests=3)
    arrivals = list(workload.initial())
    assert workload.num_requests == len(arrivals) == 3
    assert [a.time for a in arrivals] == [0.0, 0.25, 0.5]
    assert arrivals[2].req.origin_input_ids == array("I", [9] * 32 + [2] * 8)  # packed
    assert hash_id_tokens([2**32 + 5], 3, 4) == [5, 5, 5]  # mod 2**32, as Dynamo's u32


def test_mooncake_bad_lines_name_their_line_and_the_valid_fields(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        mooncake_line(0, 100, [1])
        + mooncake_line(2000, 100, [1])
        + '{"timestamp": 5, "input_length": 100, "output_length": 4}\n'
        + mooncake_line(10, 1100, [1, 2])
        + mooncake_line(20, 100, [1, -2])
        + "{oops\n"
        + mooncake_line(1000, 100, [1])
    )
    with pytest.raises(WorkloadError) as info:
        open_trace(path, "mooncake")
    errors = info.value.errors
    assert errors[0] == (
        f"{path}:3: Object missing required field `hash_ids`; valid fields: timestamp, "
        "input_length, output_length, hash_ids (required: timestamp, input_length, "
        "output_length, hash_ids)"
    )
    assert errors[1].startswith(f"{path}:4: 2 hash_ids for input_length 1100, which takes 3 ")
    assert "--trace-block-size" in errors[1]
    assert errors[2] == f"{path}:5: Expected `int` >= 0 - at `$.hash_ids[1]`"
    assert errors[3].startswith(f"{path}:6: JSON is malformed")
    assert errors[4] == (
        f"{path}:7: arrives at 1.000 s, before line 2 at 2.000 s (from the first request); "
        "a trace must be in time order"
    )
    assert len(errors) == 5


def test_many_bad_lines_print_each_problem_once_with_a_count(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [mooncake_line(i, 10 + i % 100, [1, 2]) for i in range(3000)]  # 2 ids for 1 block
    lines[7] = '{"timestamp": 7}\n'
    path.write_text("".join(lines))
    with pytest.raises(WorkloadError) as info:
        open_trace(path, "mooncake")
    errors = info.value.errors
    assert len(errors) == 2
    assert errors[0].startswith(f"{path}:1: 2 hash_ids for input_length 10, ")
    assert errors[0].endswith("(and 2998 more lines like it: 2, 3, 4, 5, 6, ...)")
    assert errors[1].startswith(f"{path}:8: Object missing required field `input_length`")


def test_azure_csv_arrivals_are_offsets_from_the_first_timestamp(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:17:00.0000000,0,7\n"
        "2023-11-16 18:17:01.5+00:00,20,3\n"
    )
    workload = open_trace(path, "azure", speedup=2.0)
    arrivals = list(workload.initial())
    assert [len(a.req.origin_input_ids) for a in arrivals] == [374, 396, 20]
    assert [a.req.sampling_params.max_new_tokens for a in arrivals] == [44, 109, 3]
    assert math.isclose(arrivals[1].time, (50.995169 - 46.68059) / 2, abs_tol=1e-6)
    assert math.isclose(arrivals[2].time, (60 + 1.5 + 13.31941) / 2, abs_tol=1e-6)
    assert workload.notes == [
        f"{path}: skipped 1 record (0 ContextTokens or GeneratedTokens), the first at line 4"
    ]
    same = [a.req.origin_input_ids for a in open_trace(path, "azure").initial()]
    assert same == [a.req.origin_input_ids for a in arrivals]  # random tokens from the seed


def test_azure_bad_rows(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "yesterday,374,44\n"
        "2023-11-16 18:15:50,3.5,109\n"
        "2023-11-16 18:15:51,1\n"
        "2023-11-16 18:15:52,7,²\n"
    )
    with pytest.raises(WorkloadError) as info:
        open_trace(path, "azure")
    assert info.value.errors == [
        f"{path}:2: TIMESTAMP must be a date and time like 2023-11-16 18:15:46.6805900, "
        "got 'yesterday'",
        f"{path}:3: ContextTokens must be a whole number >= 0, got '3.5'",
        f"{path}:4: 2 values where the header has 3",
        f"{path}:5: GeneratedTokens must be a whole number >= 0, got '²'",
    ]
    path.write_text("time,context,generated\n1,2,3\n")
    with pytest.raises(WorkloadError, match="needs TIMESTAMP, ContextTokens, GeneratedTokens"):
        open_trace(path, "azure")


def test_burstgpt_csv(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,230,1317,Conversation log\n"
        "50,GPT-4,300,0,300,API log\n"
        "118.5,GPT-4,417,276,693,Conversation log\n"
    )
    workload = open_trace(path, "burstgpt")
    arrivals = list(workload.initial())
    assert [a.time for a in arrivals] == [0.0, 40.0, 113.5]
    assert [len(a.req.origin_input_ids) for a in arrivals] == [472, 1087, 417]
    assert [a.req.sampling_params.max_new_tokens for a in arrivals] == [18, 230, 276]
    assert "skipped 1 record (0 Request tokens or Response tokens)" in workload.notes[0]


def test_burstgpt_with_session_columns(tmp_path):
    path = tmp_path / "burst3.csv"
    path.write_text(
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,"
        "Log Type\n"
        "0.5,abc,1.2,ChatGPT,10,2,12,Conversation log\n"
    )
    (arrival,) = open_trace(path, "burstgpt").initial()
    assert len(arrival.req.origin_input_ids) == 10


def test_sharegpt_first_human_turn_and_its_answer(tmp_path):
    long_prompt = "Tell me about prefix caching. " * 20
    conversations = [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": long_prompt + "Briefly."},
                {"from": "gpt", "value": "x" * 41},
                {"from": "human", "value": "more"},
            ],
        },
        {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},
        {
            "id": "c",
            "conversations": [
                {"from": "gpt", "value": "Hello!"},
                {"from": "human", "value": long_prompt + "In detail."},
                {"from": "gpt", "value": "y" * 8},
            ],
        },
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations, indent=2))
    assert guess_format(path) == "sharegpt"
    workload = open_trace(path, None, rate=2.0, seed=1)
    first, second = list(workload.initial())
    assert first.req.origin_input_ids == text_tokens(long_prompt + "Briefly.")
    assert first.req.sampling_params.max_new_tokens == 11  # 41 characters, 4 per token
    assert second.req.sampling_params.max_new_tokens == 2
    a, b = first.req.origin_input_ids, second.req.origin_input_ids
    shared = len(long_prompt) // 4
    assert a[:shared] == b[:shared] and a[shared:] != b[shared:]
    assert 0 < first.time < second.time  # Poisson arrivals at the rate
    assert "skipped 1 record (no non-empty human turn followed by a gpt turn)" in workload.notes[0]
    item_b = path.read_text().splitlines().index('    "id": "b",')  # the line before, 0-based
    assert f"the first at line {item_b}" in workload.notes[0]
    assert [a.time for a in open_trace(path, None).initial()] == [0.0, 0.0]  # no rate
    path.write_text(json.dumps(conversations))  # all on one line
    assert [a.req.rid for a in open_trace(path, None).initial()] == [
        "conversation0",
        "conversation1",
    ]


def test_files_may_start_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "sharegpt.json"
    turns = [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi you"}]
    path.write_text(json.dumps([{"conversations": turns}]), encoding="utf-8-sig")
    (arrival,) = open_trace(path, "sharegpt").initial()
    assert arrival.req.origin_input_ids == text_tokens("hello there")
    path = tmp_path / "trace.jsonl"
    path.write_text(mooncake_line(0, 600, [7, 8]), encoding="utf-8-sig")
    (arrival,) = open_trace(path, "mooncake").initial()
    assert arrival.req.origin_input_ids[:512].tolist() == [7] * 512


def test_jsonl_rids_are_unique_with_the_line_numbers_taken_as_rids(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt_len": 4, "rid": "line2"}\n{"prompt_len": 4}\n')
    with pytest.raises(WorkloadError) as info:
        open_trace(path, "jsonl")
    assert info.value.errors == [
        f"{path}:2: rid 'line2' (a line without 'rid' takes line<N>) is used by an earlier "
        "line; rids must be unique"
    ]


def test_sharegpt_bad_items_name_their_line(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(
        '[\n  {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": 3}]},\n'
        '  {"conversations": "none"},\n  {"id": 1}\n]\n'
    )
    with pytest.raises(WorkloadError) as info:
        open_trace(path, "sharegpt")
    errors = info.value.errors
    assert errors[0] == f"{path}:2: Expected `str`, got `int` - at `$.conversations[1].value`"
    assert errors[1] == f"{path}:3: Expected `array`, got `str` - at `$.conversations`"
    assert errors[2].startswith(f"{path}:4: Object missing required field `conversations`")


def test_jsonl_carries_priority_and_cache_namespaces(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(
        '{"prompt_len": 8, "priority": 3, "cache_salt": "user-9", "extra_key": "lora-a",'
        ' "routing_key": "conv-1"}\n'
        '{"input_ids": [1, 2], "arrival": 0.5}\n'
    )
    first, second = open_trace(path, "jsonl").initial()
    assert first.req.routing_key == "conv-1" and second.req.routing_key is None
    assert (first.req.priority, first.req.cache_salt, first.req.extra_key) == (
        3,
        "user-9",
        "lora-a",
    )
    assert second.req.priority is None and second.time == 0.5


def test_jsonl_out_of_order_is_sorted_with_a_note(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt_len": 4, "arrival": 2}\n{"prompt_len": 4, "arrival": 1}\n')
    workload = open_trace(path, "jsonl", speedup=2.0)
    assert [(a.req.rid, a.time) for a in workload.initial()] == [("line2", 0.5), ("line1", 1.0)]
    assert "sorted through a window of 4096 arrivals" in workload.notes[0]


def test_bad_options_are_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(mooncake_line(0, 10, [1]))
    with pytest.raises(ValueError, match="own timestamps"):
        open_trace(path, "mooncake", rate=3.0)
    with pytest.raises(ValueError, match="valid: jsonl, mooncake, azure, burstgpt, sharegpt"):
        open_trace(path, "parquet")
    with pytest.raises(ValueError, match="azure or burstgpt"):
        guess_format("trace.csv")
    with pytest.raises(ValueError, match="speedup"):
        open_trace(path, "mooncake", speedup=0.0)
    with pytest.raises(WorkloadError, match="cannot read the file"):
        open_trace(tmp_path / "missing.jsonl", "mooncake")
    (tmp_path / "empty.jsonl").write_text("\n# nothing\n")
    with pytest.raises(WorkloadError, match="no requests in the file"):
        open_trace(tmp_path / "empty.jsonl", "mooncake")


def test_write_mooncake_like_shares_prefixes_and_reads_back(tmp_path):
    path = write_mooncake_like(tmp_path / "m.jsonl", 500, seed=3)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 500
    stamps = [r["timestamp"] for r in rows]
    assert stamps == sorted(stamps) and stamps[-1] > 0
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // 512) for r in rows)
    first_blocks = [r["hash_ids"][0] for r in rows]
    assert len(set(first_blocks)) < 40  # shared system prompts
    pairs = {tuple(r["hash_ids"][:2]) for r in rows if len(r["hash_ids"]) > 2}
    assert len(pairs) < len([r for r in rows if len(r["hash_ids"]) > 2])  # follow-ups
    assert open_trace(path, "mooncake").num_requests == 500
    assert write_mooncake_like(tmp_path / "again.jsonl", 500, seed=3).read_text() == (
        path.read_text()
    )


def test_the_shipped_sample_is_write_mooncake_like_output(tmp_path):
    made = write_mooncake_like(tmp_path / "sample.jsonl", 300)
    assert SAMPLE.read_text() == made.read_text()


def test_a_large_trace_is_read_with_flat_memory(tmp_path):
    path = tmp_path / "big.jsonl"
    line = '{"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [7]}\n'
    with open(path, "w") as out:
        out.write(line * 50_000)  # 3.6 MiB
    tracemalloc.start()
    try:
        workload = open_trace(path, "mooncake", block_size=16)
        arrivals = workload.initial()
        pulled = sum(1 for _ in zip(arrivals, range(5_000), strict=False))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert workload.num_requests == 50_000 and pulled == 5_000
    # 50k requests held at once take ~44 MiB, the 5k pulled ~4 MiB, the file 3.6 MiB; one
    # request at a time takes a few KiB.
    assert peak < 2 * 2**20, f"peak {peak / 2**20:.1f} MiB"
