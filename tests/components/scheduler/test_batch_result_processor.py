import attrs
import pytest

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.scheduler.batch_result_processor import BatchResultProcessor
from schedkit.core.component import component_name
from schedkit.core.schedule_batch import (
    FinishAbort,
    FinishLength,
    FinishMatchedToken,
    ForwardMode,
    GenerationBatchResult,
    Req,
    SamplingParams,
    ScheduleBatch,
)

POOL = 64


class RecordingStreamer:
    """Records what each stream_output call was given."""

    def __init__(self, log):
        self.log = log
        self.calls = []

    def stream_output(self, reqs, return_logprob=False, skip_req=None):
        self.log.append("stream")
        self.calls.append(
            {
                "rids": [r.rid for r in reqs],
                "skip": None if skip_req is None else skip_req.rid,
                "finished": [r.rid for r in reqs if r.finished_reason is not None],
            }
        )


def make(eos_token_id=None, now=None):
    log = []
    allocator = TokenToKVPoolAllocator(size=POOL)
    cache = RadixCache(allocator=allocator)
    streamer = RecordingStreamer(log)
    processor = BatchResultProcessor(
        allocator=allocator,
        tree_cache=cache,
        output_streamer=streamer,
        eos_token_id=eos_token_id,
        report_prefill_stats=lambda batch: log.append(("prefill_stats", len(batch.reqs))),
        report_decode_stats=lambda batch: log.append(("decode_stats", len(batch.reqs))),
        increment_generated_tokens=lambda n: log.append(("generated", n)),
        advance_forward_ct_decode=lambda: log.append("advance"),
        abort_request=lambda rid: log.append(("abort", rid)),
        now=now,
    )
    return processor, allocator, cache, streamer, log


def admitted(allocator, rid, prompt, max_new_tokens=4, **params):
    """A request just prefilled: KV for its whole prompt, no cache prefix."""
    req = Req(
        rid=rid,
        origin_input_ids=list(prompt),
        sampling_params=SamplingParams(max_new_tokens=max_new_tokens, **params),
    )
    req.kv_indices = allocator.alloc(len(prompt))
    return req


def prefill(reqs, tokens, extend_lens=None):
    batch = ScheduleBatch(
        reqs=reqs,
        forward_mode=ForwardMode.EXTEND,
        prefix_lens=[0] * len(reqs),
        extend_lens=extend_lens or [len(r.origin_input_ids) for r in reqs],
    )
    return batch, GenerationBatchResult(next_token_ids=tokens)


def decode_step(allocator, reqs, tokens):
    for req in reqs:
        req.kv_indices.append(allocator.alloc(1)[0])
    batch = ScheduleBatch(reqs=reqs, forward_mode=ForwardMode.DECODE)
    return batch, GenerationBatchResult(next_token_ids=tokens)


def test_registered_frozen_component():
    assert component_name(BatchResultProcessor) == "batch_result_processor"
    processor = make()[0]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        processor.eos_token_id = 3


def test_prefill_appends_first_tokens_caches_and_streams_then_reports():
    processor, allocator, cache, streamer, log = make()
    one = admitted(allocator, "one", [1, 2, 3], max_new_tokens=1)
    more = admitted(allocator, "more", [1, 2, 9])
    processor.process_batch_result(*prefill([one, more], [40, 41]))

    assert one.output_ids == [40] and one.finished_reason == FinishLength(1)
    assert one.kv_indices == [] and one.last_node is None
    assert more.output_ids == [41] and more.finished_reason is None
    # The unfinished request now holds the cache's slots for its prompt, locked.
    match = cache.match_prefix([1, 2, 9])
    assert more.kv_indices == match.device_indices and more.last_node is match.last_node
    assert cache.protected_size() == 3 and cache.evictable_size() == 1  # token 3 of "one"
    assert allocator.available_size() + cache.total_size() == POOL
    assert streamer.calls == [{"rids": ["one", "more"], "skip": None, "finished": ["one"]}]
    assert log == ["stream", ("prefill_stats", 2)]


def test_middle_chunk_gives_no_token_is_published_and_not_streamed():
    processor, allocator, cache, streamer, log = make()
    chunk = admitted(allocator, "chunk", [1, 2, 3, 4])
    # First chunk: KV for 2 of the 4 prompt tokens.
    allocator.free(chunk.kv_indices[2:])
    chunk.kv_indices = chunk.kv_indices[:2]
    chunk.is_chunked = True
    other = admitted(allocator, "other", [7, 8])
    processor.process_batch_result(*prefill([chunk, other], [None, 5], extend_lens=[2, 2]))

    assert chunk.output_ids == []
    assert chunk.prefix_len == 2 and cache.match_prefix([1, 2]).prefix_len == 2
    assert other.output_ids == [5]
    assert streamer.calls == [{"rids": ["chunk", "other"], "skip": "chunk", "finished": []}]
    assert ("abort", "chunk") not in log


def test_decode_counts_appends_finishes_streams_advances_and_reports_in_order():
    processor, allocator, cache, streamer, log = make()
    a = admitted(allocator, "a", [1, 2], max_new_tokens=2)
    b = admitted(allocator, "b", [3, 4], max_new_tokens=3)
    processor.process_batch_result(*prefill([a, b], [10, 20]))
    log.clear()
    streamer.calls.clear()

    processor.process_batch_result(*decode_step(allocator, [a, b], [11, 21]))
    assert a.output_ids == [10, 11] and a.finished_reason == FinishLength(2)
    assert b.output_ids == [20, 21] and b.finished_reason is None
    assert a.kv_indices == [] and cache.match_prefix([1, 2, 10]).prefix_len == 3
    assert len(b.kv_indices) == 3
    assert streamer.calls == [{"rids": ["a", "b"], "skip": None, "finished": ["a"]}]
    assert log == [("generated", 2), "stream", "advance", ("decode_stats", 2)]

    processor.process_batch_result(*decode_step(allocator, [b], [22]))
    assert b.finished_reason == FinishLength(3)
    assert cache.protected_size() == 0
    assert allocator.available_size() + cache.total_size() == POOL


def test_eos_and_stop_tokens_finish_a_request():
    processor, allocator, _, streamer, _ = make(eos_token_id=0)
    eos = admitted(allocator, "eos", [1], max_new_tokens=10)
    ignore = admitted(allocator, "ignore", [2], max_new_tokens=10, ignore_eos=True)
    stop = admitted(allocator, "stop", [3], max_new_tokens=10, stop_token_ids=(9,))
    processor.process_batch_result(*prefill([eos, ignore, stop], [5, 5, 5]))
    processor.process_batch_result(*decode_step(allocator, [eos, ignore, stop], [0, 0, 9]))
    assert eos.finished_reason == FinishMatchedToken(0)
    assert ignore.finished_reason is None
    assert stop.finished_reason == FinishMatchedToken(9)
    assert streamer.calls[-1]["finished"] == ["eos", "stop"]


def test_missing_token_aborts_that_request_only():
    processor, allocator, _, streamer, log = make()
    a = admitted(allocator, "a", [1, 2])
    b = admitted(allocator, "b", [3, 4])
    processor.process_batch_result(*prefill([a, b], [None, 7]))
    assert isinstance(a.finished_reason, FinishAbort)
    assert "no token" in a.finished_reason.message
    assert a.output_ids == [] and a.kv_indices == []
    assert ("abort", "a") in log
    assert b.output_ids == [7]
    log.clear()
    c = admitted(allocator, "c", [5, 6])
    processor.process_batch_result(*prefill([c], [8]))
    log.clear()
    processor.process_batch_result(*decode_step(allocator, [b, c], [None, 9]))
    assert isinstance(b.finished_reason, FinishAbort) and b.output_ids == [7]
    assert c.output_ids == [8, 9]
    assert log[:2] == [("abort", "b"), ("generated", 1)]
    assert streamer.calls[-1] == {"rids": ["b", "c"], "skip": None, "finished": ["b"]}


def test_result_length_must_match_the_batch():
    processor, allocator, *_ = make()
    a = admitted(allocator, "a", [1, 2])
    with pytest.raises(ValueError, match="one entry per request"):
        processor.process_batch_result(*prefill([a], [1, 2]))


def test_idle_batch_streams_an_empty_batch():
    processor, _, _, streamer, log = make()
    processor.process_batch_result(
        ScheduleBatch(reqs=[], forward_mode=ForwardMode.IDLE),
        GenerationBatchResult(next_token_ids=[]),
    )
    assert streamer.calls == [{"rids": [], "skip": None, "finished": []}]
    assert log == ["stream"]


def test_process_aborted_releases_kv_and_streams():
    processor, allocator, cache, streamer, _ = make()
    a = admitted(allocator, "a", [1, 2, 3])
    a.finished_reason = FinishAbort("aborted")
    processor.process_aborted([a])
    assert a.kv_indices == []
    assert allocator.available_size() + cache.total_size() == POOL
    assert streamer.calls == [{"rids": ["a"], "skip": None, "finished": ["a"]}]


def test_now_stamps_token_times_and_inter_token_latencies():
    clock = iter([1.0, 1.5, 2.25])
    processor, allocator, *_ = make(now=lambda: next(clock))
    a = admitted(allocator, "a", [1], max_new_tokens=3)
    processor.process_batch_result(*prefill([a], [4]))
    processor.process_batch_result(*decode_step(allocator, [a], [5]))
    processor.process_batch_result(*decode_step(allocator, [a], [6]))
    assert a.first_token_time == 1.0
    assert a.itl == [0.5, 0.75]
    assert a.last_token_time == a.finish_time == 2.25


def test_now_counts_the_gap_of_a_retraction_as_one_inter_token_latency():
    clock = iter([1.0, 4.0])
    processor, allocator, cache, *_ = make(now=lambda: next(clock))
    a = admitted(allocator, "a", [1, 2], max_new_tokens=3)
    processor.process_batch_result(*prefill([a], [4]))
    # Retracted, then prefilled again with its output so far.
    cache.cache_finished_req(a)
    a.reset_for_retract()
    a.kv_indices = allocator.alloc(3)
    processor.process_batch_result(*prefill([a], [5], extend_lens=[3]))
    assert a.first_token_time == 1.0
    assert a.itl == [3.0]
    assert a.output_ids == [4, 5]


def test_decode_inter_token_latencies_per_request_when_last_tokens_came_at_different_times():
    clock = iter([1.0, 2.0, 3.5, 4.0])
    processor, allocator, *_ = make(now=lambda: next(clock))
    a = admitted(allocator, "a", [1], max_new_tokens=5)
    b = admitted(allocator, "b", [2], max_new_tokens=5)
    c = admitted(allocator, "c", [3], max_new_tokens=5)
    processor.process_batch_result(*prefill([a], [4]))  # t=1.0
    processor.process_batch_result(*prefill([b, c], [4, 4]))  # t=2.0
    processor.process_batch_result(*decode_step(allocator, [a, b, c], [5, 5, 5]))  # t=3.5
    processor.process_batch_result(*decode_step(allocator, [b, a, c], [6, 6, 6]))  # t=4.0
    assert a.itl == [2.5, 0.5]
    assert b.itl == c.itl == [1.5, 0.5]
    assert a.last_token_time == b.last_token_time == c.last_token_time == 4.0
