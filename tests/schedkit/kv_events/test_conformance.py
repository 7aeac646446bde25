"""StreamChecker on its own: the live order, causes and what follows from them, short
reports, and no input that makes it raise (fuzzed with malformed but decodable batches of
every event type under every profile, and with arbitrary msgpack and bytes)."""

from __future__ import annotations

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from schedkit.kv_events import (
    PROFILES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    GapDetected,
    GapFilled,
    HistoryLost,
    KVEventBatch,
    PublisherRestarted,
    decode_batch,
    encode_batch,
)
from schedkit.kv_events.conformance import StreamChecker
from tests.schedkit.kv_events.engine_structs import (
    VllmNewestBatch,
    VllmNewestBlockRemoved,
    VllmNewestBlockStored,
)
from tests.schedkit.kv_events.newest import (
    H1,
    H2,
    H3,
    PAGE,
    bytes_hash_payload,
    cleared_payload,
    hybrid_payloads,
)
from tests.schedkit.kv_events.newest import (
    stored as vllm_stored,
)

INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1


def stored(h: int, parent: int | None = None, rank: int = 0) -> KVEventBatch:
    return KVEventBatch(float(h), [BlockStored([h], parent, [h] * 2, 2, None, "GPU")], rank)


def decoded(payload: bytes) -> KVEventBatch | None:
    """What the subscriber makes of a payload (it decodes every profile)."""
    try:
        return decode_batch(payload)
    except msgspec.DecodeError:
        return None


def live(checker: StreamChecker, seq: int, batch_or_payload, *notices, applied=True) -> None:
    """A live frame as the subscriber handles it: its notices, then (unless it drops it) the
    batch applied."""
    payload = (
        batch_or_payload
        if isinstance(batch_or_payload, bytes)
        else encode_batch(batch_or_payload, checker.profile)
    )
    checker.begin_live(seq, payload)
    for notice in notices:
        checker.notice(notice)
    if applied:
        checker.apply(seq, payload, decoded(payload))
    checker.end_live()


def test_a_clean_chain_conforms():
    checker = StreamChecker()
    for seq in range(5):
        live(checker, seq, stored(seq + 1, seq or None))
    assert checker.conformant
    assert checker.report() == ["conformant: 5 batches, 5 events, 0 problems, 5 pages held"]


def test_page_problems_after_lost_history_count_under_it_until_a_clear():
    checker = StreamChecker()
    live(checker, 0, stored(1))
    live(checker, 5, stored(6, 5), GapDetected(1, 5), HistoryLost(1, 3))
    live(checker, 6, KVEventBatch(0.0, [BlockRemoved([4, 5])], 0))
    live(checker, 7, KVEventBatch(0.0, [AllBlocksCleared()], 0))
    live(checker, 8, stored(9, 8))  # the page set is known again: this one counts
    assert checker.report() == [
        "NOT conformant: 5 batches, 5 events, 2 problems (+3 that follow from them), 1 pages held",
        "  seqs 1..2 lost: the replay's history starts at seq 3",
        "    then 3 problems that follow from it, e.g. seq 5: parent 5 of 6 not stored",
        "  seq 8: parent 8 of 9 not stored",
    ]


def test_a_clear_ends_a_cause_in_stream_order_within_a_frame():
    checker = StreamChecker()
    live(checker, 0, stored(1))
    cleared_then_orphan = KVEventBatch(
        0.0, [AllBlocksCleared(), BlockStored([9], 8, [9, 9], 2, None, "GPU")], 0
    )
    live(checker, 3, cleared_then_orphan, HistoryLost(1, 3))
    assert checker.report()[1:] == [
        "  seqs 1..2 lost: the replay's history starts at seq 3",
        "  seq 3: parent 8 of 9 not stored",
    ]


def test_many_problems_of_one_kind_share_a_line():
    checker = StreamChecker()
    for seq in range(1000):
        live(checker, seq, stored(seq + 10_000, seq))
    assert checker.problem_count == 1000
    assert checker.report()[1:] == [
        "  seq 0: parent 0 of 10000 not stored (and 999 more like it: seqs 1, 2, 3, 4, 5, ...)"
    ]


def test_a_duplicate_the_replay_dropped_has_no_consequences():
    checker = StreamChecker()
    live(checker, 0, stored(1))
    live(checker, 0, stored(1), applied=False)
    live(checker, 1, stored(2, 1))
    assert checker.report()[1:] == ["  seq 0 received twice (the same payload again)"]


def test_a_duplicate_taken_for_a_restart_is_the_cause_of_what_follows():
    checker = StreamChecker(has_replay=False)
    live(checker, 0, stored(1))
    live(checker, 1, stored(2, 1))
    # Without replay the subscriber starts over: a restart, and seq 0 missing.
    live(checker, 1, stored(2, 1), PublisherRestarted(1, 1), HistoryLost(0, None))
    live(checker, 2, KVEventBatch(0.0, [BlockRemoved([1])], 0))
    assert checker.report() == [
        "NOT conformant: 4 batches, 4 events, 1 problems (+3 that follow from them), 1 pages held",
        "  seq 1 received twice (the same payload again)",
        "    then 3 problems that follow from it, e.g. started over at seq 1 as after a "
        "restart: seq 0 missing",
    ]


def test_reordered_and_rewound_seqs():
    checker = StreamChecker()
    live(checker, 0, stored(1))
    checker.begin_live(2, encode_batch(stored(3, 2)))
    checker.notice(GapDetected(1, 2))
    checker.apply(1, encode_batch(stored(2, 1)), stored(2, 1))  # replayed
    checker.apply(2, encode_batch(stored(3, 2)), stored(3, 2))
    checker.notice(GapFilled(1, 1))
    checker.end_live()
    live(checker, 1, stored(2, 1), applied=False)  # late: the replay filled it already
    live(checker, 2, stored(7, 1), applied=False)  # the same seq, another batch
    assert checker.report()[1:] == [
        "  seq 2 received again with another payload",
        "  seq 1 arrived after seq 2 (reordered)",
    ]


def test_a_restart_is_told_by_the_subscriber_with_replay_and_by_seq_0_without():
    with_replay = StreamChecker()
    without = StreamChecker(has_replay=False)
    for checker in (with_replay, without):
        live(checker, 0, stored(1))
        live(checker, 1, stored(2, 1))
        live(checker, 0, KVEventBatch(1.0, [AllBlocksCleared()], 0), PublisherRestarted(1, 0))
        live(checker, 1, stored(5))
        assert checker.conformant, checker.report()
    # Without replay a seq that goes back elsewhere than to 0 is no restart.
    checker = StreamChecker(has_replay=False)
    live(checker, 0, stored(1))
    live(checker, 5, stored(2), HistoryLost(1, None))
    live(checker, 3, stored(3), PublisherRestarted(5, 3), HistoryLost(0, None))
    assert "  seq 3 arrived after seq 5 (reordered)" in checker.report()


def test_the_rank_is_the_first_batch_or_the_one_named():
    checker = StreamChecker()
    live(checker, 0, stored(1, rank=2))
    live(checker, 1, stored(2, 1, rank=0))
    assert checker.report()[1:] == ["  seq 1: attn_dp_rank 0, the stream's rank is 2"]
    named = StreamChecker(dp_rank=0)
    live(named, 0, stored(1, rank=2))
    assert named.report()[1:] == ["  seq 0: attn_dp_rank 2, the stream's rank is 0"]


def test_a_stream_of_empty_batches_fits_every_profile():
    for profile in PROFILES:
        checker = StreamChecker(profile)
        live(checker, 0, KVEventBatch(1.0, [], 0))
        assert checker.stream_profile is None and checker.conformant


def test_an_undecodable_payload_is_a_cause():
    checker = StreamChecker()
    live(checker, 0, stored(1))
    live(checker, 1, b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x91\xc0\x00")
    live(checker, 2, stored(3, 2))
    lines = checker.report()
    assert lines[1].startswith("  seq 1: not what sglang sends: does not decode with sglang's")
    assert (
        lines[2] == "    then 1 problems that follow from it, e.g. seq 2: parent 2 of 3 not stored"
    )


def test_a_hybrid_models_groups_and_tiers_keep_their_own_pages():
    checker = StreamChecker("vllm")
    for seq, payload in enumerate([*hybrid_payloads(), cleared_payload()]):
        live(checker, seq, payload)
    assert checker.report() == ["conformant: 5 batches, 9 events, 0 problems, 0 pages held"]
    # A tier's copy of a page the GPU still holds (SGLang's host cache) is no second store,
    # its parent may be held in another tier, and it goes from one tier only.
    checker = StreamChecker()
    live(checker, 0, stored(1))
    copy = BlockStored([2], 1, [2, 2], 2, None, "CPU_PINNED")
    live(checker, 1, KVEventBatch(1.0, [BlockStored([2], 1, [2, 2], 2, None, "GPU"), copy], 0))
    live(checker, 2, KVEventBatch(2.0, [BlockRemoved([2], "GPU"), copy], 0))
    assert checker.report() == [
        "NOT conformant: 3 batches, 5 events, 1 problems, 2 pages held",
        "  seq 2: 2 (CPU_PINNED) stored again without being removed",
    ]


def test_bytes_block_hashes_are_a_cause_that_says_what_to_do():
    checker = StreamChecker("vllm")
    live(checker, 0, stored(1))
    live(checker, 1, bytes_hash_payload())
    lines = checker.report()
    assert lines[1].startswith(
        "  seq 1: not what vllm sends: does not decode with vllm's declarations: block hashes "
        "are bytes at `$[1][0].block_hashes[0]`"
    )
    assert "run vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1" in lines[1]


def vllm_payload(ts: float, *events) -> bytes:
    return msgspec.msgpack.encode(VllmNewestBatch(ts, list(events), 0))


def test_what_vllm_sends_for_reused_duplicated_and_offloaded_pages_conforms():
    """vLLM 0.33 (v1/core/block_pool.py, kv_offload): a request in kv_cache_report_mode
    "full" re-reports the pages it reused from block 0 (never removed for it); two requests
    computing a page at once each store and each remove it; the offload connector announces
    a page it has no metadata for with no tokens and block_size 0; a sliding-window group
    skips the pages outside its window (fewer hashes than its tokens, even none)."""
    placeholder = VllmNewestBlockStored([H3], None, [], 0, None, "CPU", None, group_idx=0)
    window = vllm_stored([H3], H2, 1, "sliding_window")
    window.token_ids = window.token_ids * 2  # the page before H3 was out of the window
    none_in_window = vllm_stored([], H1, 1, "sliding_window")
    none_in_window.token_ids = [7] * PAGE
    payloads = [
        vllm_payload(1.0, vllm_stored([H1, H2], None, 0, "full_attention")),
        vllm_payload(2.0, vllm_stored([H1, H2], None, 0, "full_attention")),  # re-reported
        vllm_payload(3.0, *[vllm_stored([H3], H2, 0, "full_attention")] * 2),  # computed twice
        vllm_payload(4.0, placeholder, window, none_in_window),
        vllm_payload(
            5.0,
            *[VllmNewestBlockRemoved([H3], "GPU", 0)] * 2,
            VllmNewestBlockRemoved([H3], "CPU", 0),
            VllmNewestBlockRemoved([H2, H1], "GPU", 0),
        ),
    ]
    checker = StreamChecker("vllm")
    for seq, payload in enumerate(payloads):
        live(checker, seq, payload)
    # H1, H2: one copy each left (the re-report's); H3 in group 1.
    assert checker.report() == ["conformant: 5 batches, 11 events, 0 problems, 3 pages held"]
    # What is still wrong: a page removed once more than it was stored, a main-attention
    # page without its tokens, tokens for more pages than hashes in a main-attention group.
    removed = VllmNewestBlockRemoved([H1], "GPU", 0)
    no_tokens = vllm_stored([H3], None, 0, "full_attention")
    no_tokens.token_ids = []
    short = vllm_stored([H3], None, 0, "full_attention")
    short.token_ids = short.token_ids * 2
    for seq, event in enumerate([removed, removed, no_tokens, short], 5):
        live(checker, seq, vllm_payload(float(seq), event))
    assert checker.report()[1:] == [
        "  seq 7: 0 token ids for 1 hashes of block_size 4 (and 1 more like it: seqs 8)",
        f"  seq 6: removed {H1} (group 0), which is not stored",
    ]


def test_the_pages_held_are_bounded_and_the_report_says_what_went_unchecked():
    checker = StreamChecker(max_pages=3)
    for seq in range(5):  # the fourth page goes past the bound: pages unchecked from seq 3
        live(checker, seq, stored(seq + 1, seq or None))
    live(checker, 5, KVEventBatch(5.0, [BlockRemoved([1, 99])], 0))  # not checked
    assert checker.conformant
    assert checker.report() == [
        "conformant (pages checked in part): 6 batches, 6 events, 0 problems, 0 pages held",
        "  pages not checked from seq 3 on: more than 3 pages held at once (--max-pages)",
    ]
    live(checker, 6, KVEventBatch(6.0, [AllBlocksCleared()], 0))  # known again: checked
    live(checker, 7, stored(8, 7))
    live(checker, 8, stored(9, 8))
    assert checker.report() == [
        "NOT conformant (pages checked in part): 9 batches, 9 events, 1 problems, 2 pages held",
        "  pages not checked from seq 3 until seq 6 cleared them: more than 3 pages held at "
        "once (--max-pages)",
        "  seq 7: parent 7 of 8 not stored",
    ]


def test_a_stream_naming_many_ranks_adds_one_line():
    checker = StreamChecker(dp_rank=0)
    for seq in range(1000):
        live(checker, seq, stored(seq + 1, seq or None, rank=seq + 1))
    assert checker.report()[1:] == [
        "  seq 0: attn_dp_rank 1, the stream's rank is 0 (and 999 more like it: seqs 1, 2, 3, "
        "4, 5, ...)"
    ]
    assert len(checker.findings.by_kind) == 1


# -- fuzzing ------------------------------------------------------------------------------

any_int = st.integers(INT64_MIN, UINT64_MAX)
small_int = st.integers(-3, 3)
ints = st.lists(st.one_of(any_int, small_int), max_size=4)
text = st.none() | st.text(max_size=3)
events = st.one_of(
    st.builds(
        BlockStored,
        ints,
        st.none() | any_int | small_int,
        ints,
        st.one_of(small_int, any_int),
        st.none() | any_int,
        text,
        cache_salt=text,
        session_id=text,
        lora_name=text,
    ),
    st.builds(BlockRemoved, ints, text),
    st.builds(AllBlocksCleared),
)
malformed_batches = st.builds(
    KVEventBatch,
    st.floats(allow_nan=True),
    st.lists(events, max_size=4),
    st.none() | small_int | any_int,
)
msgpack_values = st.recursive(
    st.none() | st.booleans() | any_int | st.floats() | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "block_hashes", "medium", "x"]), inner, max_size=3
        )
    ),
    max_leaves=12,
)
batch_like = st.tuples(
    st.floats(),
    st.lists(
        st.one_of(
            st.dictionaries(
                st.sampled_from(["block_hashes", "parent_block_hash", "token_ids", "block_size"]),
                msgpack_values,
            ).map(lambda d: {"type": "BlockStored", **d}),
            st.lists(msgpack_values, max_size=6).map(lambda x: ["BlockRemoved", *x]),
            msgpack_values,
        ),
        max_size=3,
    ),
    msgpack_values,
).map(lambda t: msgspec.msgpack.encode(list(t)))


@st.composite
def payloads(draw) -> bytes:
    kind = draw(st.sampled_from(["batch", "msgpack", "bytes"]))
    if kind == "batch":
        return encode_batch(draw(malformed_batches), draw(st.sampled_from(PROFILES)))
    if kind == "msgpack":
        return draw(batch_like)
    return draw(st.binary(max_size=20))


notices = st.one_of(
    st.builds(GapDetected, small_int, small_int),
    st.builds(GapFilled, small_int, small_int),
    st.builds(HistoryLost, small_int, st.none() | small_int),
    st.builds(PublisherRestarted, small_int, small_int, st.sampled_from(["seq", "epoch"])),
)
steps = st.lists(
    st.tuples(
        st.sampled_from(["live", "dropped live", "replayed", "notice"]),
        st.integers(0, 6),
        payloads(),
        st.lists(notices, max_size=2),
    ),
    max_size=8,
)


NO_HASHES = encode_batch(KVEventBatch(0.0, [BlockStored([], 1, [], 0, None)], 0))


@settings(max_examples=200, deadline=None)
@example(  # a string that is not UTF-8
    steps=[("live", 0, b"\xa1\x80", [])], profile="sglang", has_replay=False, dp_rank=None, frames=0
)
@example(  # a BlockStored with no hashes
    steps=[("replayed", 0, NO_HASHES, [])], profile="vllm", has_replay=True, dp_rank=0, frames=1
)
@given(
    steps=steps,
    profile=st.sampled_from(PROFILES),
    has_replay=st.booleans(),
    dp_rank=st.none() | small_int,
    frames=st.integers(0, 2),
)
def test_no_stream_makes_the_checker_raise(steps, profile, has_replay, dp_rank, frames):
    checker = StreamChecker(profile, dp_rank=dp_rank, has_replay=has_replay)
    for kind, seq, payload, found in steps:
        if kind == "notice":
            for notice in found:
                checker.notice(notice)
        elif kind == "replayed":
            checker.apply(seq, payload, decoded(payload))
        else:
            live(checker, seq, payload, *found, applied=kind == "live")
    checker.bad_frames(frames)
    lines = checker.report()
    assert lines and all(isinstance(line, str) for line in lines)
    assert isinstance(checker.conformant, bool)
    assert lines[0].startswith("conformant" if checker.conformant else "NOT conformant")
