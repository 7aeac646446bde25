from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedkit.components.io.io_struct import (
    BatchEmbeddingOutput,
    BatchTokenIDOutput,
    RequestTimes,
    decode_output,
    encode,
)
from schedkit.components.io.output_sender import InprocOutputCollector, OutputTally
from schedkit.components.io.output_streamer import OutputStreamer
from schedkit.components.io.token_wire import EncodedTokenIDOutput
from schedkit.core.parallel_state import ParallelState
from schedkit.core.schedule_batch import FinishAbort, FinishLength, Req, SamplingParams
from tests.components.io.test_output_sender import tally_counts


class RecordingSender:
    def __init__(self):
        self.messages = []

    def send(self, msg):
        self.messages.append(msg)


def make_streamer(**kwargs):
    kwargs.setdefault("sender", RecordingSender())
    kwargs.setdefault("tree_cache", SimpleNamespace())
    kwargs.setdefault("parallel_state", ParallelState())
    return OutputStreamer(**kwargs)


def make_req(rid="r", stream=False, stream_interval=None, prompt=(1, 2, 3, 4), **fields):
    params = SamplingParams(stream=stream, stream_interval=stream_interval, max_new_tokens=1000)
    return Req(rid=rid, origin_input_ids=list(prompt), sampling_params=params, **fields)


def step(streamer, reqs, token=7, **kwargs):
    """Append one token to each request and stream; returns the new messages."""
    sender = streamer.sender
    before = len(sender.messages)
    for req in reqs:
        req.output_ids.append(token)
    streamer.stream_output(reqs, **kwargs)
    return sender.messages[before:]


def sent_lengths(streamer, reqs, steps):
    """Output-id counts at which a message went out for the single request in ``reqs``."""
    sent_at = []
    for _ in range(steps):
        if step(streamer, reqs):
            sent_at.append(len(reqs[0].output_ids))
    return sent_at


def test_interval_one_sends_every_token_with_only_the_new_ones():
    streamer = make_streamer()
    req = make_req(stream=True)
    for i in range(3):
        (msg,) = step(streamer, [req], token=10 + i)
        assert isinstance(msg, BatchTokenIDOutput)
        assert msg.output_ids == [[10 + i]]
        assert msg.completion_tokens == [i + 1]
        assert msg.finished_reasons == [None]
        assert req.send_token_offset == i + 1


def test_request_interval_above_one_sends_at_remainder_one():
    streamer = make_streamer()
    req = make_req(stream=True, stream_interval=3)
    assert sent_lengths(streamer, [req], 8) == [1, 4, 7]
    tokens = [m.output_ids[0] for m in streamer.sender.messages]
    assert [len(t) for t in tokens] == [1, 3, 3]


def test_server_interval_applies_when_the_request_has_none():
    streamer = make_streamer(stream_interval=2)
    assert sent_lengths(streamer, [make_req(stream=True)], 6) == [1, 3, 5]
    own = make_streamer(stream_interval=2)
    assert sent_lengths(own, [make_req(stream=True, stream_interval=1)], 3) == [1, 2, 3]


def test_non_streaming_requests_are_sent_every_force_stream_interval():
    streamer = make_streamer(stream_interval=1, force_stream_interval=4)
    req = make_req(stream=False)
    assert sent_lengths(streamer, [req], 9) == [4, 8]
    req.output_ids.append(99)
    req.finished_reason = FinishLength(10)
    streamer.stream_output([req])
    assert [m.output_ids[0] for m in streamer.sender.messages] == [[7] * 4, [7] * 4, [7, 99]]
    assert streamer.sender.messages[-1].finished_reasons == [FinishLength(10)]


def test_finished_request_is_sent_exactly_once():
    streamer = make_streamer()
    req = make_req(stream=False)
    req.output_ids = [5, 6]
    req.finished_reason = FinishLength(2)
    streamer.stream_output([req])
    streamer.stream_output([req])
    (msg,) = streamer.sender.messages
    assert msg.output_ids == [[5, 6]]
    assert req.finished_output


def test_finished_request_with_nothing_new_still_gets_its_final_message():
    streamer = make_streamer()
    req = make_req(stream=True)
    step(streamer, [req])
    req.finished_reason = FinishAbort("aborted by client")
    streamer.stream_output([req])
    final = streamer.sender.messages[-1]
    assert final.output_ids == [[]]
    assert final.finished_reasons == [FinishAbort("aborted by client")]


def test_one_message_per_call_and_none_when_nothing_is_due():
    streamer = make_streamer(force_stream_interval=50)
    waiting = [make_req(rid=f"q{i}") for i in range(3)]
    assert step(streamer, waiting) == []
    streaming = [make_req(rid=f"s{i}", stream=True) for i in range(3)]
    (msg,) = step(streamer, waiting + streaming)
    assert msg.rids == ["s0", "s1", "s2"]


def test_skip_req_is_not_sent_and_keeps_its_offset():
    streamer = make_streamer()
    a, b = make_req(rid="a", stream=True), make_req(rid="b", stream=True)
    (msg,) = step(streamer, [a, b], skip_req=b)
    assert msg.rids == ["a"]
    assert b.send_token_offset == 0


def test_unfinished_request_without_new_tokens_is_not_sent():
    streamer = make_streamer()
    req = make_req(stream=True)
    step(streamer, [req])
    streamer.stream_output([req])
    assert len(streamer.sender.messages) == 1


def test_message_carries_counts_and_dp_rank():
    streamer = make_streamer(parallel_state=ParallelState(dp_rank=1, dp_size=2))
    req = make_req(stream=True, prompt=range(6), cached_tokens=2)
    (msg,) = step(streamer, [req])
    assert (msg.prompt_tokens, msg.completion_tokens, msg.cached_tokens) == ([6], [1], [2])
    assert msg.cached_tokens_details == [{"device": 2, "host": 0}]
    assert msg.dp_rank == 1


def test_idle_batch_is_sent_only_under_dp_attention():
    plain = make_streamer()
    plain.stream_output([], is_idle_batch=True)
    assert plain.sender.messages == []
    dp = make_streamer(parallel_state=ParallelState(tp_size=2, dp_size=2, enable_dp_attention=True))
    dp.stream_output([], is_idle_batch=True)
    (msg,) = dp.sender.messages
    assert msg.rids == [] and msg.output_ids == []
    dp.stream_output([])
    assert len(dp.sender.messages) == 1


def test_load_and_time_stats_are_attached_only_when_a_request_finished():
    calls = []

    def get_load():
        calls.append(1)
        return {"num_running_reqs": 1}

    streamer = make_streamer(get_load=get_load)
    req = make_req(stream=True, arrival_time=2.0, scheduled_time=2.5)
    other = make_req(rid="o", stream=True, arrival_time=3.0, scheduled_time=3.25)
    (msg,) = step(streamer, [req, other])
    assert msg.load is None and msg.time_stats is None and calls == []
    req.finished_reason = FinishLength(1)
    step(streamer, [req, other])
    last = streamer.sender.messages[-1]
    assert last.load == {"num_running_reqs": 1}
    assert calls == [1]
    # On the wire, the finished request's times on this scheduler's clock; none for the other.
    decoded = decode_output(encode(last))
    assert decoded.rids == ["r", "o"]
    assert decoded.time_stats == [RequestTimes(arrival_time=2.0, scheduled_time=2.5), None]


class FileBackend:
    pass


@pytest.mark.parametrize(
    "counts, hicache, backend, expected",
    [
        ({}, False, None, None),
        ({"cached_tokens": 5}, False, None, {"device": 5, "host": 0}),
        (
            {"cached_tokens_device": 3, "cached_tokens_host": 2},
            False,
            None,
            {"device": 3, "host": 2},
        ),
        ({"cached_tokens_host": 4}, False, None, {"device": 0, "host": 4}),
        (
            {"cached_tokens_device": 1, "cached_tokens_storage": 6},
            False,
            None,
            {"device": 1, "host": 0, "storage": 6},
        ),
        (
            {"cached_tokens_device": 1},
            True,
            None,
            {"device": 1, "host": 0, "storage": 0, "storage_backend": "none"},
        ),
        (
            {"cached_tokens_storage": 2},
            True,
            FileBackend(),
            {"device": 0, "host": 0, "storage": 2, "storage_backend": "FileBackend"},
        ),
        ({"cached_tokens": 0}, True, FileBackend(), None),
    ],
)
def test_cached_tokens_details_variants(counts, hicache, backend, expected):
    tree_cache = SimpleNamespace(cache_controller=SimpleNamespace(storage_backend=backend))
    streamer = make_streamer(tree_cache=tree_cache, enable_hicache_storage=lambda: hicache)
    assert streamer.get_cached_tokens_details(make_req(**counts)) == expected


def test_hicache_flag_is_read_at_each_call():
    flag = {"on": False}
    streamer = make_streamer(enable_hicache_storage=lambda: flag["on"])
    req = make_req(cached_tokens_device=2)
    assert "storage" not in streamer.get_cached_tokens_details(req)
    flag["on"] = True
    assert streamer.get_cached_tokens_details(req)["storage_backend"] == "none"


def test_embedding_requests_are_sent_only_when_finished_and_once():
    streamer = make_streamer(is_generation=False)
    done, running = make_req(rid="done", cached_tokens=1), make_req(rid="running")
    done.finished_reason = FinishLength(0)
    streamer.stream_output([done, running])
    streamer.stream_output([done, running])
    (msg,) = streamer.sender.messages
    assert isinstance(msg, BatchEmbeddingOutput)
    assert msg.rids == ["done"]
    assert (msg.prompt_tokens, msg.cached_tokens) == ([4], [1])
    assert msg.cached_tokens_details == [{"device": 1, "host": 0}]


def test_messages_survive_the_real_encoding():
    collector = InprocOutputCollector()
    streamer = make_streamer(sender=collector)
    req = make_req(rid="x", stream=True, cached_tokens_device=1)
    step(streamer, [req], token=3)
    req.output_ids.append(4)
    req.finished_reason = FinishLength(2)
    streamer.stream_output([req])
    assert collector.outputs == {"x": [3, 4]}
    assert collector.finished == {"x": FinishLength(2)}
    assert collector.double_finishes == []


@pytest.mark.parametrize("field", ["stream_interval", "force_stream_interval"])
@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_bad_intervals_are_refused(field, value):
    with pytest.raises(ValueError, match=f"{field} must be an integer >= 1"):
        make_streamer(**{field: value})


@settings(max_examples=60, deadline=None)
@given(
    plans=st.lists(
        st.tuples(
            st.booleans(),
            st.one_of(st.none(), st.integers(1, 5)),
            st.integers(1, 30),
        ),
        min_size=1,
        max_size=4,
    ),
    server_interval=st.integers(1, 4),
    force_interval=st.integers(1, 8),
)
def test_every_token_is_delivered_once_in_order(plans, server_interval, force_interval):
    collector = InprocOutputCollector(roundtrip=False)
    streamer = make_streamer(
        sender=collector, stream_interval=server_interval, force_stream_interval=force_interval
    )
    reqs = [
        make_req(rid=f"r{i}", stream=stream, stream_interval=interval)
        for i, (stream, interval, _) in enumerate(plans)
    ]
    lengths = {req.rid: length for req, (_, _, length) in zip(reqs, plans, strict=True)}
    running = list(reqs)
    t = 0
    while running:
        for req in running:
            t += 1
            req.output_ids.append(t)
            if len(req.output_ids) == lengths[req.rid]:
                req.finished_reason = FinishLength(lengths[req.rid])
        streamer.stream_output(running)
        running = [req for req in running if req.finished_reason is None]
    for req in reqs:
        assert collector.outputs[req.rid] == req.output_ids
        assert collector.send_counts[req.rid] == 1
    assert collector.double_finishes == []
    assert all(msg.rids for msg in collector.messages)


def test_hicache_flag_is_read_once_per_call_and_applies_to_every_request():
    reads = []
    streamer = make_streamer(enable_hicache_storage=lambda: reads.append(1) or True)
    reqs = [make_req(rid=f"r{i}", stream=True, cached_tokens_device=i + 1) for i in range(3)]
    (msg,) = step(streamer, reqs)
    assert len(reads) == 1
    assert msg.cached_tokens_details == [
        {"device": i + 1, "host": 0, "storage": 0, "storage_backend": "none"} for i in range(3)
    ]
    assert msg.cached_tokens_details == [streamer.get_cached_tokens_details(r) for r in reqs]


class WireSender:
    """Keeps each message's wire bytes; takes decode steps' messages already encoded."""

    takes_encoded = True

    def __init__(self):
        self.messages = []
        self.encoded = 0

    def send(self, msg):
        if isinstance(msg, EncodedTokenIDOutput):
            self.encoded += 1
            assert msg.message() == decode_output(msg.wire)
            msg = msg.wire
        else:
            msg = encode(msg)
        self.messages.append(msg)


def run_decode_steps(use_decode_step, kinds, steps=12, finish_at=None, sender=None):
    """Decode ``steps`` steps over requests of the given kinds ((stream, interval) pairs),
    finishing request ``finish_at[step]`` at that step; the messages sent."""
    streamer = make_streamer(
        force_stream_interval=3,
        sender=sender or RecordingSender(),
        get_load=lambda: {"num_running_reqs": 2},
        parallel_state=ParallelState(dp_rank=1, dp_size=2),
    )
    reqs = [
        make_req(
            rid=f"r{i}",
            stream=stream,
            stream_interval=interval,
            prompt=[1] * (i + 1),
            cached_tokens=i,
            cached_tokens_device=i % 2,
        )
        for i, (stream, interval) in enumerate(kinds)
    ]
    running = list(reqs)
    for n in range(steps):
        for req in running:
            req.output_ids.append(n)
        finished = []
        if finish_at and n in finish_at:
            done = running[finish_at[n]]
            done.finished_reason = FinishLength(len(done.output_ids))
            finished.append(done)
        if use_decode_step:
            streamer.stream_decode_step(running, finished)
        else:
            streamer.stream_output(running)
        if finished:
            running = [r for r in running if r.finished_reason is None]
    for req in running:  # a last step at which the rest finish: every offset written
        req.output_ids.append(steps)
        req.finished_reason = FinishLength(len(req.output_ids))
    if use_decode_step:
        streamer.stream_decode_step(running, list(running))
    else:
        streamer.stream_output(running)
    messages = streamer.sender.messages
    if isinstance(sender, OutputTally):
        messages = [tally_counts(sender)]
    elif not isinstance(sender, WireSender):
        messages = [attrs_of(msg) for msg in messages]
    return messages, [(r.send_token_offset, r.finished_output) for r in reqs]


def attrs_of(msg):
    return {f: getattr(msg, f) for f in msg.__struct_fields__}


@pytest.mark.parametrize(
    "kinds",
    [
        [(True, None)] * 4,  # every token, the streamer's default interval of 1
        [(True, 1), (True, None), (True, 1)],
        [(False, None)] * 5,  # none streams: forced every 3 tokens
        [(True, 1), (False, None), (True, 2)],  # mixed: the per-request loop
    ],
)
def test_decode_steps_send_what_stream_output_sends(kinds):
    finish_at = {4: 1, 9: 0}
    assert run_decode_steps(True, kinds, finish_at=finish_at) == run_decode_steps(
        False, kinds, finish_at=finish_at
    )
    # Byte for byte on the wire, and counted alike, when the sender takes them encoded.
    wire = WireSender()
    assert run_decode_steps(True, kinds, finish_at=finish_at, sender=wire) == run_decode_steps(
        False, kinds, finish_at=finish_at, sender=WireSender()
    )
    every_token = all(stream and interval in (None, 1) for stream, interval in kinds)
    assert (wire.encoded > 5) == every_token
    assert run_decode_steps(True, kinds, finish_at=finish_at, sender=OutputTally()) == (
        run_decode_steps(False, kinds, finish_at=finish_at, sender=OutputTally())
    )


def test_a_decode_batch_streamed_elsewhere_is_not_kept():
    streamer = make_streamer()
    a, b = make_req(rid="a", stream=True), make_req(rid="b", stream=True)
    for n in range(3):
        a.output_ids.append(n)
        b.output_ids.append(n)
        streamer.stream_decode_step([a, b], [])
    assert streamer._steady._columns is not None
    a.finished_reason = FinishAbort("aborted")
    streamer.stream_output([a])  # aborted out of band
    assert streamer._steady._columns is None
    assert streamer.sender.messages[-1].finished_reasons == [FinishAbort("aborted")]
    assert streamer.sender.messages[-1].output_ids == [[]]  # all three went out already


def test_offsets_kept_with_a_batch_are_written_when_it_changes():
    streamer = make_streamer()
    a, b = make_req(rid="a", stream=True), make_req(rid="b", stream=True)
    for n in range(4):
        a.output_ids.append(n)
        b.output_ids.append(n)
        streamer.stream_decode_step([a, b], [])
    assert streamer._steady._columns is not None
    a.output_ids.append(4)  # b left the batch unfinished (retracted); a decodes alone
    streamer.stream_decode_step([a], [])
    assert streamer.sender.messages[-1].output_ids == [[4]]
    assert (a.send_token_offset, b.send_token_offset) == (5, 4)
    # An offset written meanwhile (a later one) is not overwritten by the kept lengths.
    for n in range(5, 8):
        a.output_ids.append(n)
        streamer.stream_decode_step([a], [])
    a.send_token_offset = 9
    streamer.stream_output([a])  # streamed outside a decode step: the columns let go
    assert a.send_token_offset == 9


def test_kept_columns_follow_the_storage_flag_when_it_flips():
    storage = [False]
    streamer = make_streamer(enable_hicache_storage=lambda: storage[0])
    req = make_req(stream=True, cached_tokens=2, cached_tokens_device=2)
    sent = []
    for n in range(4):
        storage[0] = n >= 2
        req.output_ids.append(n)
        streamer.stream_decode_step([req], [])
        sent.append(streamer.sender.messages[-1].cached_tokens_details)
    assert sent[0] == sent[1] == [{"device": 2, "host": 0}]
    assert sent[2] == sent[3] == [{"device": 2, "host": 0, "storage": 0, "storage_backend": "none"}]


class RunSender(RecordingSender):
    """Counts runs of decode steps as one call (``send_decode_run``)."""

    takes_decode_runs = True

    def send_decode_run(self, rids, steps):
        self.messages.append(("run", list(rids), steps))


def test_a_subclass_with_its_own_stream_output_gets_every_decode_step_through_it():
    seen = []

    class Watched(OutputStreamer):
        def stream_output(self, reqs, *args, **kwargs):
            seen.append([r.rid for r in reqs])
            super().stream_output(reqs, *args, **kwargs)

    def decode(streamer):
        a, b = make_req(rid="a", stream=True), make_req(rid="b", stream=True)
        for n in range(3):
            a.output_ids.append(n)
            b.output_ids.append(n)
            streamer.stream_decode_step([a, b], [])
        return [m.output_ids for m in streamer.sender.messages], streamer.decode_run_steps(
            [a, b], 10
        )

    parts = {"tree_cache": SimpleNamespace(), "parallel_state": ParallelState()}
    plain = decode(OutputStreamer(sender=RunSender(), **parts))
    watched = decode(Watched(sender=RunSender(), **parts))
    assert seen == [["a", "b"]] * 3  # every step went through the subclass's own method
    assert watched[0] == plain[0] == [[[0], [0]], [[1], [1]], [[2], [2]]]
    assert (plain[1], watched[1]) == (10, 0)  # no run of steps past its method either
