from array import array

import pytest

from schedkit.workloads.traces import load_jsonl
from schedkit.workloads.workload import (
    ChatWorkload,
    WorkloadError,
    shared_prefix_workload,
    synthetic,
)


def test_chat_workload_shares_system_prompts_and_follows_up_with_the_conversation():
    workload = ChatWorkload(num_requests=120, rate=2.0, seed=1)
    first = list(workload.initial())
    assert all(a.req.rid.endswith("-t0") for a in first)
    times = [a.time for a in first]
    assert times == sorted(times) and times[0] > 0  # Poisson arrivals
    system_prefixes = {tuple(a.req.origin_input_ids[:500]) for a in first}
    assert len(system_prefixes) <= 32 < len(first)

    multi = next(a.req for a in first if workload._remaining_turns[a.req.rid[:-3]] > 0)
    multi.output_ids = [11, 12, 13]
    follow = workload.follow_up(multi, now=5.0)
    assert follow.time == 6.0
    assert follow.req.rid == multi.rid[:-1] + "1"
    assert follow.req.origin_input_ids[: multi.seqlen] == [*multi.origin_input_ids, 11, 12, 13]


def test_a_follow_up_of_a_packed_prompt_is_the_conversation_so_far():
    workload = ChatWorkload(num_requests=40, rate=2.0, seed=1)
    first = list(workload.initial())
    multi = next(a.req for a in first if workload._remaining_turns[a.req.rid[:-3]] > 0)
    prompt = list(multi.origin_input_ids)
    multi.origin_input_ids = array("I", prompt)  # as it waits at a fleet's router
    multi.output_ids = [11, 12]
    follow = workload.follow_up(multi, now=1.0)
    assert type(follow.req.origin_input_ids) is list
    assert follow.req.origin_input_ids[: len(prompt) + 2] == [*prompt, 11, 12]


def test_chat_workload_issues_exactly_num_requests_turns():
    workload = ChatWorkload(num_requests=30, seed=3)
    queue = [a.req for a in workload.initial()]
    issued = 0
    while queue:
        req = queue.pop()
        issued += 1
        req.output_ids = [7]
        follow = workload.follow_up(req, 0.0)
        if follow:
            queue.append(follow.req)
    assert issued == 30


def test_same_seed_same_workload():
    a = [x.req.origin_input_ids for x in synthetic("chat", 20, 1.0, 9).initial()]
    b = [x.req.origin_input_ids for x in synthetic("chat", 20, 1.0, 9).initial()]
    assert a == b


def test_shared_prefix_workload_groups():
    arrivals = list(shared_prefix_workload(num_requests=40, groups=4).initial())
    assert len(arrivals) == 40 and all(a.time == 0.0 for a in arrivals)
    assert arrivals[0].req.origin_input_ids[:384] == arrivals[4].req.origin_input_ids[:384]
    assert arrivals[0].req.origin_input_ids[384:] != arrivals[4].req.origin_input_ids[384:]
    assert {len(a.req.origin_input_ids) for a in arrivals} == {512}


def test_unknown_synthetic_name():
    with pytest.raises(ValueError, match="valid: chat, shared-prefix"):
        synthetic("nope", 1, None, 0)


def test_jsonl_workload(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(
        "# comment\n"
        '{"input_ids": [1, 2, 3], "max_new_tokens": 4, "arrival": 0.5, "rid": "a"}\n'
        "\n"
        '{"prompt_len": 10, "prefix_group": "g", "prefix_len": 6}\n'
        '{"prompt_len": 8, "prefix_group": "g", "prefix_len": 6, "stream": false}\n'
    )
    arrivals = load_jsonl(path).initial()
    assert [a.req.rid for a in arrivals] == ["line4", "line5", "a"]
    assert arrivals[2].req.origin_input_ids == [1, 2, 3]
    assert arrivals[2].req.sampling_params.max_new_tokens == 4
    g1, g2 = arrivals[0].req.origin_input_ids, arrivals[1].req.origin_input_ids
    assert g1[:6] == g2[:6] and len(g1) == 10 and len(g2) == 8
    assert not arrivals[1].req.sampling_params.stream


def test_jsonl_reports_every_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"input_ids": [1, "x"]}\n'
        "not json\n"
        '{"prompt_len": 5, "input_ids": [1]}\n'
        '{"prompt_len": 5, "colour": 1}\n'
        '{"prompt_len": 5, "max_new_tokens": 0}\n'
        '{"prompt_len": 5, "rid": "r"}\n'
        '{"prompt_len": 5, "rid": "r"}\n'
        '{"input_ids": [1, 4294967296]}\n'
    )
    with pytest.raises(WorkloadError) as info:
        load_jsonl(path)
    errors = info.value.errors
    assert errors[0] == f"{path}:1: Expected `int`, got `str` - at `$.input_ids[1]`"
    assert errors[1].startswith(f"{path}:2: JSON is malformed")
    assert errors[2] == f"{path}:3: give exactly one of 'input_ids' or 'prompt_len'"
    assert errors[3].startswith(f"{path}:4: Object contains unknown field `colour`; valid fields: ")
    assert "prompt_len, prefix_group" in errors[3] and "cache_salt, extra_key" in errors[3]
    assert errors[4] == f"{path}:5: max_new_tokens must be an integer >= 1, got 0"
    assert errors[5] == f"{path}:7: rid 'r' is used by an earlier line; rids must be unique"
    assert errors[6] == (
        f"{path}:8: 'input_ids' must be a non-empty list of token ids in [0, 4294967295]"
    )
    assert len(errors) == 7


def test_chat_rates_share_conversations_and_follow_ups_do_not_depend_on_finish_order():
    slow = ChatWorkload(num_requests=40, rate=1.0, separate_streams=True)
    fast = ChatWorkload(num_requests=40, rate=64.0, separate_streams=True)
    first_slow, first_fast = list(slow.initial()), list(fast.initial())
    content = [(a.req.origin_input_ids, a.req.sampling_params) for a in first_slow]
    assert content == [(a.req.origin_input_ids, a.req.sampling_params) for a in first_fast]
    assert [a.time for a in first_slow] != [a.time for a in first_fast]
    for a in first_slow + first_fast:
        a.req.output_ids = [5, 6]
    follows_slow = [slow.follow_up(a.req, 0.0) for a in first_slow]
    follows_fast = [fast.follow_up(a.req, 0.0) for a in reversed(first_fast)][::-1]
    assert any(follows_slow)
    assert [
        f and (f.req.rid, f.req.origin_input_ids, f.req.sampling_params) for f in follows_slow
    ] == [f and (f.req.rid, f.req.origin_input_ids, f.req.sampling_params) for f in follows_fast]
