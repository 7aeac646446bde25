"""``schedkit events tail`` against a real publisher on loopback, in-process and as a command."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import structlog

from schedkit.cli import main
from schedkit.cli.events import format_event, format_notice
from schedkit.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    GapDetected,
    GapFilled,
    HistoryLost,
    KVEventBatch,
    KvEventsConfig,
    PublisherRestarted,
    ZmqEventPublisher,
)

HEARTBEAT_TS = 9999.0


def stream_lines(text: str) -> list[str]:
    """The command's own lines (the test's publisher may log on stdout too)."""
    return [line for line in text.splitlines() if line.startswith(("seq=", "  ", "!", "rate: "))]


def first_batches() -> list[KVEventBatch]:
    return [
        KVEventBatch(ts=1.0, events=[AllBlocksCleared()]),
        KVEventBatch(
            ts=2.0,
            events=[
                BlockStored([11], None, [1, 2], 2, None, "GPU"),
                BlockStored([12], 11, [3, 4], 2, None, "GPU"),
            ],
        ),
        KVEventBatch(ts=3.0, events=[BlockRemoved([12], "GPU")]),
    ]


@pytest.fixture(autouse=True)
def default_logging():
    """Run with structlog's defaults and leave them so: ``main`` points structlog at the
    sys.stderr of its time, a stream pytest closes after the test."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture
def publisher():
    """A publisher that has sent three known batches and keeps sending empty heartbeats,
    so that a subscriber joining late sees a live seq and replays what it missed."""
    pub = ZmqEventPublisher(
        KvEventsConfig(endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0")
    )
    for batch in first_batches():
        pub.publish(batch)
    pub.flush()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.02):
            pub.publish(KVEventBatch(ts=HEARTBEAT_TS, events=[]))

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    yield pub
    stop.set()
    thread.join()
    pub.shutdown(timeout=1.0)


def test_tail_prints_replayed_batches_and_the_notice(publisher, capsys):
    status = main(
        ["events", "tail", publisher.endpoint, "--replay", publisher.replay_endpoint,
         "--count", "3", "--timeout", "10"]
    )  # fmt: skip
    lines = stream_lines(capsys.readouterr().out)
    assert status == 0
    notices = [line for line in lines if line.startswith("!")]
    assert len(notices) == 1 and notices[0].startswith("! replay filled seqs 0..")
    assert [line for line in lines if not line.startswith("!")] == [
        "seq=0 dp=0 ts=1.000000 events=1 stored=0 removed=0 cleared=1",
        "seq=1 dp=0 ts=2.000000 events=2 stored=2 removed=0 cleared=0",
        "seq=2 dp=0 ts=3.000000 events=1 stored=0 removed=1 cleared=0",
    ]


def test_tail_verbose_prints_every_event(publisher, capsys):
    status = main(
        ["events", "tail", publisher.endpoint, "--replay", publisher.replay_endpoint,
         "-v", "--count", "3", "--timeout", "10"]
    )  # fmt: skip
    lines = [line for line in stream_lines(capsys.readouterr().out) if not line.startswith("!")]
    assert status == 0
    assert lines == [
        "seq=0 dp=0 ts=1.000000 events=1 stored=0 removed=0 cleared=1",
        "  cleared",
        "seq=1 dp=0 ts=2.000000 events=2 stored=2 removed=0 cleared=0",
        "  stored hashes=[11] parent=None block_size=2 medium=GPU tokens=[1, 2]",
        "  stored hashes=[12] parent=11 block_size=2 medium=GPU tokens=[3, 4]",
        "seq=2 dp=0 ts=3.000000 events=1 stored=0 removed=1 cleared=0",
        "  removed hashes=[12] medium=GPU",
    ]


def test_vllms_group_kind_and_locality_are_printed_when_an_event_has_them():
    swa = {"group_idx": 1, "kv_cache_spec_kind": "sliding_window", "locality": "LOCAL"}
    assert format_event(BlockStored([5], None, [1, 2], 2, None, "GPU", **swa)) == (
        "  stored hashes=[5] parent=None block_size=2 medium=GPU group=1 kind=sliding_window "
        "locality=LOCAL tokens=[1, 2]"
    )
    assert format_event(BlockRemoved([5], "CPU", 0)) == "  removed hashes=[5] medium=CPU group=0"


def test_tail_without_replay_reports_lost_history_and_stats(publisher, capsys):
    status = main(["events", "tail", publisher.endpoint, "--stats", "--timeout", "1.3"])
    lines = stream_lines(capsys.readouterr().out)
    assert status == 0
    assert lines[0] == "! history lost from seq 0 (no replay endpoint)"
    batches = [line for line in lines if line.startswith("seq=")]
    assert batches and all("ts=9999.000000 events=0" in line for line in batches)
    seqs = [int(line.split()[0].removeprefix("seq=")) for line in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[0] >= 3
    rates = [line for line in lines if line.startswith("rate: ")]
    assert len(rates) == 1
    assert rates[0].startswith("rate: batches=") and "events=0.0/s stored=0.0/s" in rates[0]
    assert float(rates[0].split()[1].removeprefix("batches=").removesuffix("/s")) > 5


def test_tail_count_not_reached_before_the_timeout_fails(capsys):
    pub = ZmqEventPublisher(KvEventsConfig(endpoint="tcp://127.0.0.1:0"))
    try:
        status = main(["events", "tail", pub.endpoint, "--count", "1", "--timeout", "0.2"])
    finally:
        pub.shutdown(timeout=0.5)
    captured = capsys.readouterr()
    assert status == 1 and stream_lines(captured.out) == []
    assert "0 of 1 batches in 0.2s" in captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tcp://127.0.0.1:1", "--count", "0"], "expected a whole number > 0, got '0'"),
        (["tcp://127.0.0.1:1", "--timeout", "soon"], "expected a number > 0, got 'soon'"),
        (["tcp://127.0.0.1:1", "--profile", "trt"], "invalid choice: 'trt'"),
    ],
)
def test_bad_arguments(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["events", "tail", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_bad_endpoint_is_reported(capsys):
    assert main(["events", "tail", "nonsense://x", "--timeout", "0.1"]) == 2
    assert "cannot connect to 'nonsense://x'" in capsys.readouterr().err


def test_notice_lines():
    assert format_notice(GapDetected(5, 9)) == (
        "! gap: expected seq 5, received 9; asking for a replay"
    )
    assert format_notice(GapFilled(5, 8)) == "! replay filled seqs 5..8"
    assert format_notice(HistoryLost(5, 7)) == "! history lost from seq 5 (replay started at 7)"
    assert format_notice(HistoryLost(5, None)) == "! history lost from seq 5 (replay had nothing)"
    assert format_notice(HistoryLost(0, None), has_replay=False) == (
        "! history lost from seq 0 (no replay endpoint)"
    )
    assert format_notice(PublisherRestarted(10, 0)) == "! publisher restarted: seq 10 -> 0"


def test_tail_as_a_command(publisher):
    result = subprocess.run(
        [sys.executable, "-m", "schedkit.cli", "events", "tail", publisher.endpoint,
         "--replay", publisher.replay_endpoint, "--count", "2", "--timeout", "20"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "\n".join(stream_lines(result.stdout)) + "\n"  # logs go to stderr
    lines = [line for line in result.stdout.splitlines() if not line.startswith("!")]
    assert lines == [
        "seq=0 dp=0 ts=1.000000 events=1 stored=0 removed=0 cleared=1",
        "seq=1 dp=0 ts=2.000000 events=2 stored=2 removed=0 cleared=0",
    ]
