"""``schedkit events check`` against real publishers on loopback: a cache's stream under each
profile conforms; the wrong profile is said in one line; faults in the live order, wrong
ranks, holes and broken page rules are caught, each under its cause."""

from __future__ import annotations

import argparse
import threading
import time

import msgspec
import pytest
import structlog

from schedkit.cli import main
from schedkit.cli.events import cmd_check
from schedkit.components.cache.radix_cache import RadixCache, RadixKey
from schedkit.kv_events import (
    PROFILES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KvEventsConfig,
    ZmqEventPublisher,
    encode_batch,
)
from schedkit.kv_events.conformance import CheckedSubscriber, StreamChecker
from tests.schedkit.kv_events import engine_structs
from tests.schedkit.kv_events.hostile import RawPublisher, deep_batch
from tests.schedkit.kv_events.newest import bytes_hash_payload, cleared_payload, hybrid_payloads


@pytest.fixture(autouse=True)
def default_logging():
    """``main`` points structlog at the sys.stderr of its time, which pytest closes after the
    test: start and end with structlog's defaults."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


def publisher(profile: str = "sglang", **kwargs) -> ZmqEventPublisher:
    # The checker joins late: a heartbeat soon tells it of the history to replay.
    kwargs.setdefault("heartbeat_interval", 0.05)
    config = KvEventsConfig(
        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", profile=profile, **kwargs
    )
    return ZmqEventPublisher(config)


def cache_batches() -> list[KVEventBatch]:
    """What a radix cache records: stores, a split, namespaced pages, evictions, a reset."""
    cache = RadixCache(page_size=4, capacity=64, enable_kv_cache_events=True)
    batches = []
    for key in ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], RadixKey([1] * 8, "lora")):
        cache.insert(key)
        batches.append(KVEventBatch(0.0, cache.take_events()))
    cache.evict(12)
    batches.append(KVEventBatch(0.0, cache.take_events()))
    cache.insert(list(range(40)))
    cache.reset()
    cache.insert([5] * 16)
    batches.append(KVEventBatch(0.0, cache.take_events()))
    return batches


def cache_stream(pub: ZmqEventPublisher) -> None:
    for batch in cache_batches():
        pub.publish(batch)
    assert pub.flush()


def check(pub, capsys, *extra: str) -> tuple[int, list[str]]:
    args = ["events", "check", pub.endpoint, "--replay", pub.replay_endpoint, "--timeout", "5"]
    code = main([*args, *extra])
    out = capsys.readouterr().out
    return code, [line for line in out.splitlines() if not line.startswith("20")]


class Running:
    """``events check`` running in a thread while the test publishes to it live."""

    def __init__(self, pub, *extra: str, replay: bool = True, timeout: float = 5.0) -> None:
        args = ["events", "check", pub.endpoint, "--timeout", str(timeout), *extra]
        if replay:
            args += ["--replay", pub.replay_endpoint]
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, args=(args,))
        self.thread.start()
        pub.wait_subscribed()

    def _run(self, args: list[str]) -> None:
        self.code = main(args)

    def result(self, capsys) -> tuple[int, list[str], str]:
        self.thread.join(30)
        assert not self.thread.is_alive()
        captured = capsys.readouterr()
        return self.code, captured.out.splitlines(), captured.err


def stored(h: int, parent: int | None = None, rank: int | None = None) -> KVEventBatch:
    return KVEventBatch(float(h), [BlockStored([h], parent, [h] * 4, 4, None, "GPU")], rank)


@pytest.mark.parametrize("profile", PROFILES)
def test_a_cache_stream_conforms_under_its_profile(profile, capsys):
    pub = publisher(profile)
    try:
        cache_stream(pub)
        code, lines = check(pub, capsys, "--profile", profile, "--count", "6")
    finally:
        pub.shutdown()
    assert code == 0, lines
    # 6 batches, and a heartbeat or two that came with them
    assert lines[0].startswith("conformant: ") and "8 events, 0 problems" in lines[0]


WRONG = [(sent, asked) for sent in PROFILES for asked in PROFILES if sent != asked]


@pytest.mark.parametrize(("sent", "asked"), WRONG)
def test_the_wrong_profile_is_said_in_one_line(sent, asked, faulty_kv_publisher, capsys):
    pub = faulty_kv_publisher(
        KvEventsConfig(
            endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", profile=sent
        )
    )
    running = Running(pub, "--profile", asked, "--count", "5")
    for batch in cache_batches():
        pub.publish(batch)
    code, out, err = running.result(capsys)
    assert code == 1
    assert out == [
        f"NOT conformant: the stream decodes as profile {sent}, not {asked}; "
        f"rerun with --profile {sent}"
    ]
    assert err == ""


def test_the_wrong_profile_of_replayed_history_is_said_in_one_line(capsys):
    pub = publisher("vllm")
    try:
        cache_stream(pub)  # before the check joins: it all comes through the replay
        code, lines = check(pub, capsys, "--count", "6")
    finally:
        pub.shutdown()
    assert code == 1
    assert lines == [
        "NOT conformant: the stream decodes as profile vllm, not sglang; rerun with --profile vllm"
    ]


# The newest vLLM (0.33.0) sends, for a full-attention model, its group and attention kind
# with every event, and a session, extra keys per page and locality where it has them.
NEWEST_VLLM_STORED = {
    "group_idx": 0,
    "kv_cache_spec_kind": "full_attention",
    "locality": "LOCAL",
    "session_id": "chat-7",
}


def engine_payloads(engine: str) -> list[bytes]:
    """The cache's batches as each engine encodes them, with its own declarations
    (``vllm-newest``: vLLM 0.33.0's, every optional field set)."""
    families = {
        "sglang": (engine_structs.BlockStored, engine_structs.BlockRemoved),
        "sglang-array": (engine_structs.ArrayBlockStored, engine_structs.ArrayBlockRemoved),
        "vllm": (engine_structs.VllmBlockStored, engine_structs.VllmBlockRemoved),
        "vllm-newest": (
            engine_structs.VllmNewestBlockStored,
            engine_structs.VllmNewestBlockRemoved,
        ),
    }
    batch_type, cleared_type = {
        "sglang": (engine_structs.KVEventBatch, engine_structs.AllBlocksCleared),
        "sglang-array": (engine_structs.ArrayBatch, engine_structs.ArrayAllBlocksCleared),
        "vllm": (engine_structs.VllmBatch, engine_structs.VllmAllBlocksCleared),
        "vllm-newest": (engine_structs.VllmNewestBatch, engine_structs.VllmNewestAllBlocksCleared),
    }[engine]
    stored_type, removed_type = families[engine]
    newest = engine == "vllm-newest"
    payloads = []
    for batch in cache_batches():
        events = []
        for e in batch.events:
            if type(e) is BlockStored:
                fields = [e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, None]
                extra = {"medium": e.medium}
                if engine != "sglang-array":
                    extra["lora_name"] = e.lora_name
                if newest:
                    extra.update(NEWEST_VLLM_STORED, extra_keys=[None] * len(e.block_hashes))
                events.append(stored_type(*fields, **extra))
            elif type(e) is BlockRemoved:
                extra = {"group_idx": 0, "locality": "LOCAL"} if newest else {}
                events.append(removed_type(e.block_hashes, e.medium, **extra))
            else:
                events.append(cleared_type())
        payloads.append(msgspec.msgpack.encode(batch_type(1.0, events, 0)))
    return payloads


@pytest.mark.parametrize("engine", [*PROFILES, "vllm-newest"])
def test_what_each_engine_sends_conforms_to_its_profile_only(engine, faulty_kv_publisher, capsys):
    payloads = engine_payloads(engine)
    profile = "vllm" if engine == "vllm-newest" else engine
    for asked in PROFILES:
        pub = faulty_kv_publisher()
        running = Running(pub, "--profile", asked, "--count", str(len(payloads)))
        for payload in payloads:
            pub.publish_raw(payload)
        code, out, _ = running.result(capsys)
        if asked == profile:
            assert (code, out) == (0, ["conformant: 5 batches, 8 events, 0 problems, 4 pages held"])
        else:
            assert code == 1
            assert out == [
                f"NOT conformant: the stream decodes as profile {profile}, not {asked}; "
                f"rerun with --profile {profile}"
            ]


def test_a_hybrid_models_stream_conforms_and_bytes_hashes_say_what_to_do(
    faulty_kv_publisher, capsys
):
    pub = faulty_kv_publisher()
    running = Running(pub, "--profile", "vllm", "--count", "5")
    for payload in [*hybrid_payloads(), bytes_hash_payload(), cleared_payload()]:
        pub.publish_raw(payload)
    code, out, err = running.result(capsys)
    assert (code, out[0], err) == (
        1,
        "NOT conformant: 5 batches, 9 events, 1 problems, 0 pages held",
        "",
    )
    assert out[1:] == [
        "  seq 4: not what vllm sends: does not decode with vllm's declarations: block hashes are "
        "bytes at `$[1][0].block_hashes[0]`: run vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 "
        "(pages are keyed by 64-bit int hashes, as SGLang, Dynamo's router and vLLM's default "
        "send them)"
    ]


def test_broken_page_rules_are_listed(capsys):
    pub = publisher()
    try:
        pub.publish(KVEventBatch(0.0, [BlockStored([1], 99, [1, 2, 3], 4, None)]))
        pub.publish(KVEventBatch(0.0, [BlockRemoved([7])]))
        pub.publish(KVEventBatch(0.0, [BlockStored([2], None, [1] * 4, 4, None)] * 2))
        assert pub.flush()
        code, lines = check(pub, capsys, "--count", "3")
        bounded = check(pub, capsys, "--count", "3", "--max-pages", "1")
    finally:
        pub.shutdown()
    assert code == 1
    assert lines[0].startswith("NOT conformant: ") and ", 4 problems, 2 pages held" in lines[0]
    assert lines[1:] == [
        "  seq 0: 3 token ids for 1 hashes of block_size 4",
        "  seq 0: parent 99 of 1 not stored",
        "  seq 1: removed 7, which is not stored",
        "  seq 2: 2 stored again without being removed",
    ]
    # Past --max-pages the page rules stop, and the report says from where.
    code, lines = bounded
    assert code == 1 and lines[0].startswith("NOT conformant (pages checked in part): ")
    assert (
        lines[1]
        == "  pages not checked from seq 2 on: more than 1 pages held at once (--max-pages)"
    )
    assert "  seq 2: 2 stored again without being removed" not in lines and len(lines) == 5


def test_nothing_arriving_is_not_conformant(capsys):
    pub = publisher(heartbeat_interval=0)
    try:
        code, lines = check(pub, capsys, "--timeout", "0.3")
    finally:
        pub.shutdown()
    assert code == 1 and "no batch arrived" in lines[1]


def test_history_the_replay_no_longer_has_is_the_cause_of_what_follows(faulty_kv_publisher, capsys):
    config = KvEventsConfig(
        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", buffer_steps=3
    )
    pub = faulty_kv_publisher(config)
    chain(pub, 1, 6)  # seqs 0..5, before the check joins
    running = Running(pub, "--count", "3")
    chain(pub, 7, 7)  # seq 6: the replay now keeps seqs 4..6
    code, out, _ = running.result(capsys)
    assert code == 1
    assert out == [
        "NOT conformant: 3 batches, 3 events, 1 problems (+1 that follow from them), 3 pages held",
        "  seqs 0..3 lost: the replay's history starts at seq 4",
        "    then 1 problems that follow from it, e.g. seq 4: parent 4 of 5 not stored",
    ]


def live_publisher(faulty_kv_publisher, replay: bool):
    config = KvEventsConfig(
        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0" if replay else None
    )
    return faulty_kv_publisher(config)


def chain(pub, first: int, last: int) -> None:
    for h in range(first, last + 1):
        pub.publish(stored(h, h - 1 if h > 1 else None))


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "no-replay"])
def test_a_duplicated_seq_is_caught(replay, faulty_kv_publisher, capsys):
    pub = live_publisher(faulty_kv_publisher, replay)
    # Without replay the subscriber takes the copy in: one batch more.
    running = Running(pub, "--count", "6" if replay else "7", replay=replay)
    chain(pub, 1, 2)
    pub.duplicate()
    chain(pub, 3, 6)
    code, out, err = running.result(capsys)
    assert code == 1
    assert out[1] == "  seq 2 received twice (the same payload again)"
    if replay:  # the recovered stream dropped the copy: nothing follows from it
        assert out[0] == "NOT conformant: 6 batches, 6 events, 1 problems, 6 pages held"
        assert len(out) == 2
    else:  # the subscriber took it for a restart and starts over
        assert out[0].startswith("NOT conformant: 7 batches, 7 events, 1 problems (+")
        assert out[2].startswith("    then ")
        assert len(out) == 3
    assert err == ""


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "no-replay"])
def test_reordered_seqs_are_caught(replay, faulty_kv_publisher, capsys):
    pub = live_publisher(faulty_kv_publisher, replay)
    running = Running(pub, "--count", "6", "--timeout", "3", replay=replay)
    chain(pub, 1, 2)
    pub.hold(3)
    chain(pub, 3, 5)
    pub.release(reverse=True)  # seqs 4, 3, 2
    chain(pub, 6, 6)
    code, out, _ = running.result(capsys)
    assert code == 1
    assert "  seq 3 arrived after seq 4 (reordered) (and 1 more like it: seqs 2)" in out
    if replay:
        assert out[0] == "NOT conformant: 6 batches, 6 events, 2 problems, 6 pages held"
        assert out[1:] == ["  seq 3 arrived after seq 4 (reordered) (and 1 more like it: seqs 2)"]


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "no-replay"])
def test_a_rewound_seq_is_caught(replay, faulty_kv_publisher, capsys):
    pub = live_publisher(faulty_kv_publisher, replay)
    # With replay the rewound seqs are dropped; without, the subscriber takes them in.
    running = Running(pub, "--count", "5" if replay else "7", replay=replay)
    chain(pub, 1, 4)
    pub.next_seq = 2  # the counter goes back, the publisher is the same
    pub.publish(stored(5, 4))
    pub.publish(stored(6, 5))
    pub.publish(KVEventBatch(0.0, []))  # seq 4
    code, out, _ = running.result(capsys)
    assert code == 1
    assert "  seq 2 received again with another payload (and 1 more like it: seqs 3)" in out


def poll_until(sub: CheckedSubscriber, done, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, sub.checker.report()
        sub.poll(20)


def test_a_restart_is_no_fault(faulty_kv_publisher):
    pub = live_publisher(faulty_kv_publisher, replay=True)
    checker = StreamChecker()
    with CheckedSubscriber(checker, pub.endpoint, pub.replay_endpoint) as sub:
        pub.wait_subscribed()
        chain(pub, 1, 4)
        # The subscriber learns the publisher's epoch from its first batch: restart after.
        poll_until(sub, lambda: checker.batches == 4)
        pub.restart()  # seq 0: AllBlocksCleared
        chain(pub, 1, 2)
        poll_until(sub, lambda: checker.batches == 7)
    assert checker.report() == ["conformant: 7 batches, 7 events, 0 problems, 2 pages held"]


def test_a_restart_without_replay_is_no_fault(faulty_kv_publisher, capsys):
    pub = live_publisher(faulty_kv_publisher, replay=False)
    running = Running(pub, "--count", "7", replay=False)
    chain(pub, 1, 4)
    pub.restart()
    chain(pub, 1, 2)
    code, out, _ = running.result(capsys)
    assert (code, out) == (0, ["conformant: 7 batches, 7 events, 0 problems, 2 pages held"]), out


def test_a_wrong_rank_is_caught_even_where_the_replay_hides_the_batch(faulty_kv_publisher, capsys):
    pub = live_publisher(faulty_kv_publisher, replay=True)
    running = Running(pub, "--count", "5")
    chain(pub, 1, 3)
    pub.publish(stored(4, 3, rank=1))
    pub.next_seq = 2  # a second publisher for rank 0's stream, as seen on the wire
    pub.publish(stored(9, None, rank=1))
    chain(pub, 5, 5)
    pub.publish(KVEventBatch(0.0, []))  # seq 4
    code, out, _ = running.result(capsys)
    assert code == 1
    assert "  seq 3: attn_dp_rank 1, the stream's rank is 0 (and 1 more like it: seqs 2)" in out
    assert "  seq 2 received again with another payload (and 1 more like it: seqs 3)" in out


def test_the_expected_rank_can_be_named(faulty_kv_publisher, capsys):
    pub = faulty_kv_publisher(None, dp_rank=3)
    running = Running(pub, "--count", "3", "--dp-rank", "0")
    chain(pub, 1, 3)
    code, out, _ = running.result(capsys)
    assert code == 1
    assert out[1:] == [
        "  seq 0: attn_dp_rank 3, the stream's rank is 0 (and 2 more like it: seqs 1, 2)"
    ]


def test_without_replay_a_late_start_says_a_replay_endpoint_would_recover_it(
    faulty_kv_publisher, capsys
):
    pub = live_publisher(faulty_kv_publisher, replay=True)
    chain(pub, 1, 3)  # before the check joins
    running = Running(pub, "--count", "3", replay=False)
    chain(pub, 4, 6)
    code, out, _ = running.result(capsys)
    assert code == 1
    assert out[1] == (
        "  the first seq seen was 3: seqs 0..2 not seen; a replay endpoint (--replay) would "
        "recover the start"
    )
    assert out[2] == "    then 1 problems that follow from it, e.g. seq 3: parent 3 of 4 not stored"


def test_without_replay_a_gap_says_a_replay_endpoint_would_recover_it(faulty_kv_publisher, capsys):
    pub = live_publisher(faulty_kv_publisher, replay=False)
    running = Running(pub, "--count", "4", replay=False)
    chain(pub, 1, 2)
    pub.drop(2)
    chain(pub, 3, 6)
    code, out, _ = running.result(capsys)
    assert code == 1
    assert out[1] == "  seqs 2..3 missed; a replay endpoint (--replay) would recover them"
    assert out[2].startswith("    then 1 problems that follow from it, e.g. seq 4: parent 4 of 5")


def test_with_replay_the_same_gap_is_recovered(faulty_kv_publisher, capsys):
    pub = live_publisher(faulty_kv_publisher, replay=True)
    running = Running(pub, "--count", "6")
    chain(pub, 1, 2)
    pub.drop(2)
    chain(pub, 3, 6)
    code, out, _ = running.result(capsys)
    assert (code, out) == (0, ["conformant: 6 batches, 6 events, 0 problems, 6 pages held"])


@pytest.mark.parametrize("profile", PROFILES)
def test_malformed_batches_are_reported_not_raised(profile, faulty_kv_publisher, capsys):
    config = KvEventsConfig(
        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", profile=profile
    )
    pub = faulty_kv_publisher(config)
    running = Running(pub, "--profile", profile, "--count", "5")  # 7 published, 5 decode
    pub.publish(KVEventBatch(0.0, [BlockStored([], None, [], 4, None, "GPU")]))
    pub.publish(KVEventBatch(0.0, [BlockStored([1], None, [1], 0, None, "GPU")]))
    pub.publish(KVEventBatch(0.0, [BlockStored([2], 2, [1] * 4, -4, None, "GPU")]))
    pub.publish(KVEventBatch(0.0, [BlockRemoved([]), AllBlocksCleared(), BlockRemoved([5])]))
    pub.publish_raw(b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x91\xc0\x00")  # an event of nil
    medium_not_utf8 = encode_batch(KVEventBatch(0.0, [BlockRemoved([9], "\x00")], 0), profile)
    pub.publish_raw(medium_not_utf8.replace(b"\xa1\x00", b"\xa1\x80"))
    pub.publish(KVEventBatch(0.0, []))
    code, out, err = running.result(capsys)
    assert code == 1
    assert "  seq 0: a BlockStored with no hashes" in out
    assert "  seq 1: 1 token ids for 1 hashes of block_size 0 (and 1 more like it: seqs 2)" in out
    assert "  seq 3: removed 5, which is not stored" in out
    assert any(
        line.startswith(f"  seq 4: not what {profile} sends: ")
        and line.endswith("(and 1 more like it: seqs 5)")
        for line in out
    )
    assert err == ""


@pytest.mark.parametrize("endpoint", ["not-an-endpoint", "tcp://127.0.0.1:1"])
def test_the_logging_configuration_is_restored_after_a_check(endpoint, capsys):
    before = structlog.get_config()
    args = argparse.Namespace(
        profile="sglang",
        dp_rank=None,
        replay=None,
        endpoint=endpoint,
        topic="",
        count=None,
        max_pages=1000,
        timeout=0.1,
    )
    assert cmd_check(args) == (2 if endpoint == "not-an-endpoint" else 1)
    assert structlog.get_config() == before


@pytest.mark.parametrize("command", ["check", "tail"])
def test_a_batch_nested_1000_deep_is_reported_not_raised(default_recursion_limit, capsys, command):
    pub = RawPublisher()
    stop = threading.Event()

    def send() -> None:  # the deep batch, then a good one, until the command is done
        seq = 0
        while not stop.is_set():
            pub.send(seq, deep_batch() if seq % 2 == 0 else encode_batch(KVEventBatch(0.0, [])))
            seq += 1
            time.sleep(0.02)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        status = main(["events", command, pub.endpoint, "--timeout", "1.0"])
    finally:
        stop.set()
        sender.join()
        pub.close()
    captured = capsys.readouterr()
    if command == "check":
        assert status == 1
        assert "not what sglang sends: nested too deep to decode" in captured.out
    else:
        assert status == 0
        assert "kv_events.bad_input" in captured.err and "nested too deep" in captured.err
        assert "events=0" in captured.out  # the good batches between them
