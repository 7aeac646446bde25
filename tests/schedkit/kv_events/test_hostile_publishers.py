"""What a hostile or broken publisher can do to a subscriber: nothing raises out of poll,
and what it makes the subscriber hold or do per call is bounded."""

from __future__ import annotations

import time

import msgspec
import pytest

from schedkit.kv_events import (
    PROFILES,
    HistoryLost,
    KvEventSubscriber,
    KvIndex,
    encode_batch,
    get_profile,
)
from schedkit.kv_events.structs import MAX_BATCH_BYTES, decode_batch
from schedkit.kv_events.subscriber import ReplayBounds
from schedkit.kv_events.wire_shape import shape_problems
from tests.schedkit.kv_events.engine_structs import VllmNewestBatch
from tests.schedkit.kv_events.hostile import RawPublisher, deep_batch, page_batch
from tests.schedkit.kv_events.newest import stored as vllm_stored


@pytest.mark.parametrize("profile", PROFILES)
def test_a_batch_nested_1000_deep_is_a_decode_error(default_recursion_limit, profile):
    payload = deep_batch(1000)
    assert len(payload) == 1107
    with pytest.raises(msgspec.DecodeError):
        get_profile(profile).strict_decode(payload)
    with pytest.raises(msgspec.DecodeError, match="nested too deep"):
        decode_batch(payload)
    assert all(problem is not None for problem in shape_problems(payload).values())
    # The same field a little less deep is only an unknown field: it decodes.
    assert decode_batch(deep_batch(50)).events[0].block_hashes == [1]


def test_a_payload_over_the_bound_is_a_decode_error_before_decoding():
    payload = encode_batch(page_batch(0, pages=600_000))
    assert len(payload) > MAX_BATCH_BYTES
    with pytest.raises(msgspec.DecodeError, match="over the"):
        decode_batch(payload)
    assert "over the bound" in shape_problems(payload)["sglang"]


def test_a_subscriber_counts_a_deep_batch_once_and_goes_on(default_recursion_limit, closing):
    pub = closing(RawPublisher())
    sub = closing(KvEventSubscriber(pub.endpoint))
    got: list = []
    pub.send_until(0, deep_batch(), lambda: got.extend(sub.poll(20)) or sub.decode_errors)
    for seq in range(1, 4):
        pub.send(seq, deep_batch())
    pub.send(4, encode_batch(page_batch(4)))
    deadline = time.monotonic() + 5
    while not got:
        assert time.monotonic() < deadline
        got += sub.poll(20)
    assert got[-1][0] == 4 and got[-1][1].events[0].block_hashes == [4]
    assert sub.bad_input.counts["payload"] == sub.decode_errors >= 4


def test_a_replay_that_never_ends_is_cut_and_reported_as_lost(closing):
    pub = closing(RawPublisher(endless_replay=True))
    bounds = ReplayBounds(max_batches=500, max_bytes=1 << 30, max_seconds=30)
    sub = closing(KvEventSubscriber(pub.endpoint, pub.replay_endpoint, replay_bounds=bounds))
    got: list = []
    slowest = 0.0
    deadline = time.monotonic() + 10

    def cut_reported() -> bool:
        return any(isinstance(n, HistoryLost) and n.cut for n in sub.notices)

    while not cut_reported():
        assert time.monotonic() < deadline, sub.notices
        pub.send(100_000, encode_batch(page_batch(100_000)))  # far past what was replayed
        # This thread's CPU time: the publisher's thread, in this process, takes the GIL
        # at will (the router's test measures wall time in a process of its own).
        start = time.thread_time()
        got += sub.poll(0)
        slowest = max(slowest, time.thread_time() - start)
        time.sleep(0.002)
    assert sub.replays_cut >= 1
    lost = next(n for n in sub.notices if isinstance(n, HistoryLost) and n.cut)
    assert lost.expected > 0
    # (The epoch questions were answered with batches, so cut at the first: the live frame
    # went first, as from a publisher whose replay socket does not answer, and was taken for
    # a restart when it came again.)
    start = [seq for seq, _ in got].index(0)
    # A replay from 0 delivers up to its bound (500 batches), in order, and no further.
    replayed = [seq for seq, _ in got[start : start + 600]]
    run = next((i for i in range(1, len(replayed)) if replayed[i] != i), len(replayed))
    assert 400 <= run <= 501, (replayed[: run + 3], sub.notices[:8])
    assert slowest < 0.05, slowest


def test_bad_input_is_counted_by_kind_and_logged_once_per_kind():
    from schedkit.kv_events.bad_input import BadInput

    class Log:
        def __init__(self) -> None:
            self.lines: list[tuple[str, dict]] = []

        def warning(self, event: str, **fields: object) -> None:
            self.lines.append((event, fields))

    log = Log()
    bad = BadInput("tcp://127.0.0.1:1", "kv_events.bad_input", log)
    for _ in range(3):
        bad("payload", seq=1, error="x" * 1000)
    bad("live_frames", frames=[1])
    assert bad.counts == {"payload": 3, "live_frames": 1} and bad.total == 4
    assert [fields["kind"] for _, fields in log.lines] == ["payload", "live_frames"]
    assert log.lines[0][1]["source"] == "tcp://127.0.0.1:1"
    assert len(log.lines[0][1]["error"]) == 200


def test_a_publisher_naming_a_new_rank_in_every_batch_grows_no_index(closing):
    """vLLM batches (its own declarations) naming data_parallel_rank 0..299 over a real
    socket: an index applying them without a rank keeps max_ranks of them, refuses the rest."""
    pub = closing(RawPublisher())
    sub = closing(KvEventSubscriber(pub.endpoint))
    payloads = [
        msgspec.msgpack.encode(
            VllmNewestBatch(float(rank), [vllm_stored([rank + 1], None, 0, "full_attention")], rank)
        )
        for rank in range(300)
    ]
    index = KvIndex(max_ranks=4)
    got: list = []
    pub.send_until(0, payloads[0], lambda: got.extend(sub.poll(20)) or got)
    for seq in range(1, 300):
        pub.send(seq, payloads[seq])
    deadline = time.monotonic() + 10
    while not got or got[-1][0] < 299:
        assert time.monotonic() < deadline, len(got)
        got += sub.poll(20)
    for _, batch in got:
        index.apply(batch)
    kept = [batch.attn_dp_rank for _, batch in got[:4]]
    assert index.ranks() == kept and index.bad_input["rank"] == len(got) - 4 >= 250
    assert index.match_hashes([kept[-1] + 1], kept[-1:]) == {kept[-1]: 1}
