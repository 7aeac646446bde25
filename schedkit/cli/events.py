"""``schedkit events tail``: follow a KV-event stream and print it, one line per batch.

Each batch prints as ``seq=N dp=R ts=T events=E stored=S removed=D cleared=C``; with ``-v``
every event follows on its own indented line. What the subscriber notices about the stream
(a gap, a replay that filled it, history that is gone, a publisher restart) prints as a line
starting with ``!``; ``--stats`` adds a ``rate:`` line every second.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from logging import CRITICAL
from typing import Any, TextIO

import structlog

from schedkit.cli.args import number
from schedkit.kv_events import (
    PROFILES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    GapDetected,
    GapFilled,
    HistoryLost,
    KVEventBatch,
    KvEventSubscriber,
    Notice,
    PublisherRestarted,
)
from schedkit.kv_events.conformance import CheckedSubscriber, StreamChecker
from schedkit.kv_events.page_rules import DEFAULT_MAX_CHECKED_PAGES
from schedkit.logs import restore_structlog, structlog_state

__all__ = [
    "add_parser",
    "cmd_check",
    "cmd_tail",
    "format_batch",
    "format_event",
    "format_notice",
]

_KINDS = {BlockStored: "stored", BlockRemoved: "removed", AllBlocksCleared: "cleared"}


def add_parser(subparsers: Any) -> None:
    """Add the ``events`` command (with its ``tail`` subcommand) to a subparsers action."""
    events = subparsers.add_parser("events", help="inspect KV-cache event streams")
    sub = events.add_subparsers(dest="events_command", required=True)
    p = sub.add_parser("tail", help="print a publisher's event batches as they arrive")
    p.add_argument("endpoint", help="the publisher's live endpoint, e.g. tcp://127.0.0.1:5557")
    p.add_argument("--replay", metavar="ENDPOINT", help="replay endpoint to recover missed seqs")
    p.add_argument("--topic", default="", help="topic to subscribe to (default: all)")
    p.add_argument("--profile", choices=PROFILES, default="sglang", help="wire format")
    p.add_argument("-v", "--verbose", action="store_true", help="also print every event")
    p.add_argument("--stats", action="store_true", help="print batch and event rates each second")
    p.add_argument("--count", type=number(int), help="exit after N batches")
    p.add_argument(
        "--timeout",
        type=number(float),
        help="exit after S seconds (status 1 if --count batches had not arrived)",
    )
    p.set_defaults(run=cmd_tail)

    p = sub.add_parser(
        "check",
        help="subscribe and check that a stream is what a router can rely on; exit 1 if not",
    )
    p.add_argument("endpoint", help="the publisher's live endpoint, e.g. tcp://127.0.0.1:5557")
    p.add_argument("--replay", metavar="ENDPOINT", help="replay endpoint (history from seq 0)")
    p.add_argument("--topic", default="", help="topic to subscribe to (default: all)")
    p.add_argument(
        "--profile",
        choices=PROFILES,
        default="sglang",
        help="the wire format every payload must be, as that engine declares and sends it",
    )
    p.add_argument(
        "--dp-rank",
        type=number(int, allow_minimum=True),
        help="the attn_dp_rank every batch must carry (default: the first batch's)",
    )
    p.add_argument("--count", type=number(int), help="stop after N batches")
    p.add_argument(
        "--max-pages",
        type=number(int),
        default=DEFAULT_MAX_CHECKED_PAGES,
        help="pages held at once past which page rules stop until the stream clears them "
        f"(default {DEFAULT_MAX_CHECKED_PAGES:,}, 76-132 bytes each)",
    )
    p.add_argument(
        "--timeout",
        type=number(float),
        default=10.0,
        help="stop after S seconds (default 10)",
    )
    p.set_defaults(run=cmd_check)


def format_batch(seq: int, batch: KVEventBatch) -> str:
    """The one-line summary of a batch."""
    counts = dict.fromkeys(_KINDS.values(), 0)
    for event in batch.events:
        counts[_KINDS[type(event)]] += 1
    kinds = " ".join(f"{kind}={n}" for kind, n in counts.items())
    return f"seq={seq} dp={batch.attn_dp_rank} ts={batch.ts:.6f} events={len(batch.events)} {kinds}"


def format_event(event: Any) -> str:
    """One event as an indented line with its hashes (and tokens for a stored page), and
    vLLM's KV-cache group, attention kind and locality when the event has them."""
    if type(event) is BlockStored:
        return (
            f"  stored hashes={event.block_hashes} parent={event.parent_block_hash} "
            f"block_size={event.block_size} medium={event.medium}{_group(event)} "
            f"tokens={event.token_ids}"
        )
    if type(event) is BlockRemoved:
        return f"  removed hashes={event.block_hashes} medium={event.medium}{_group(event)}"
    return "  cleared"


def _group(event: BlockStored | BlockRemoved) -> str:
    kind = event.kv_cache_spec_kind if type(event) is BlockStored else None
    fields = {"group": event.group_idx, "kind": kind, "locality": event.locality}
    return "".join(f" {name}={value}" for name, value in fields.items() if value is not None)


def format_notice(notice: Notice, has_replay: bool = True) -> str:
    """A subscriber notice as a line starting with ``!``."""
    if isinstance(notice, GapDetected):
        return (
            f"! gap: expected seq {notice.expected}, received {notice.received}; "
            "asking for a replay"
        )
    if isinstance(notice, GapFilled):
        return f"! replay filled seqs {notice.start}..{notice.end}"
    if isinstance(notice, HistoryLost):
        if notice.replay_start is not None:
            why = f"replay started at {notice.replay_start}"
        else:
            why = "replay had nothing" if has_replay else "no replay endpoint"
        return f"! history lost from seq {notice.expected} ({why})"
    if isinstance(notice, PublisherRestarted):
        return f"! publisher restarted: seq {notice.last_seq} -> {notice.new_seq}"
    return f"! {notice!r}"


class _Rates:
    """Batches and events by kind since the last report."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.start = time.monotonic()
        self.batches = 0
        self.events = dict.fromkeys(_KINDS.values(), 0)

    def add(self, batch: KVEventBatch) -> None:
        self.batches += 1
        for event in batch.events:
            self.events[_KINDS[type(event)]] += 1

    def report(self, now: float) -> None:
        elapsed = max(now - self.start, 1e-9)
        kinds = " ".join(f"{k}={n / elapsed:.1f}/s" for k, n in self.events.items())
        total = sum(self.events.values())
        print(
            f"rate: batches={self.batches / elapsed:.1f}/s events={total / elapsed:.1f}/s {kinds}",
            file=self.out,
            flush=True,
        )
        self.start = now
        self.batches = 0
        self.events = dict.fromkeys(self.events, 0)


def cmd_tail(args: argparse.Namespace) -> int:
    """Run ``schedkit events tail``; returns the exit status."""
    out = sys.stdout
    has_replay = args.replay is not None

    def notice(n: Notice) -> None:
        print(format_notice(n, has_replay), file=out, flush=True)

    try:
        sub = KvEventSubscriber(
            args.endpoint, args.replay, args.topic, args.profile, on_notice=notice
        )
    except ValueError as exc:
        print(f"schedkit events tail: {exc}", file=sys.stderr)
        return 2
    start = time.monotonic()
    deadline = None if args.timeout is None else start + args.timeout
    rates = _Rates(out) if args.stats else None
    next_report = start + 1.0
    received = 0
    try:
        while True:
            now = time.monotonic()
            if rates is not None and now >= next_report:
                rates.report(now)
                next_report += 1.0
            if deadline is not None and now >= deadline:
                break
            wait = 0.1
            if rates is not None:
                wait = min(wait, next_report - now)
            if deadline is not None:
                wait = min(wait, deadline - now)
            for seq, batch in sub.poll(max(1, int(wait * 1000))):
                print(format_batch(seq, batch), file=out)
                if args.verbose:
                    for event in batch.events:
                        print(format_event(event), file=out)
                if rates is not None:
                    rates.add(batch)
                received += 1
                if received == args.count:
                    out.flush()
                    return 0
            out.flush()
    except KeyboardInterrupt:
        return 0
    finally:
        sub.close()
    if args.count is not None:
        print(
            f"schedkit events tail: {received} of {args.count} batches in {args.timeout}s",
            file=sys.stderr,
        )
        return 1
    return 0


@contextlib.contextmanager
def _logs_silenced() -> Iterator[None]:
    """structlog logs nothing below CRITICAL inside; its configuration is restored after."""
    saved = structlog_state()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(CRITICAL))
    try:
        yield
    finally:
        restore_structlog(saved)


def cmd_check(args: argparse.Namespace) -> int:
    """Run ``schedkit events check``: 0 when the stream conforms, 1 when it does not."""
    checker = StreamChecker(
        args.profile,
        dp_rank=args.dp_rank,
        has_replay=args.replay is not None,
        max_pages=args.max_pages,
    )
    # The report says what the subscriber would log (bad frames, payloads, lost history).
    with _logs_silenced():
        try:
            sub = CheckedSubscriber(checker, args.endpoint, args.replay, args.topic)
        except ValueError as exc:
            print(f"schedkit events check: {exc}", file=sys.stderr)
            return 2
        deadline = time.monotonic() + args.timeout
        try:
            count = args.count or float("inf")
            while checker.batches < count and time.monotonic() < deadline:
                sub.poll(50)
        except KeyboardInterrupt:
            pass
        finally:
            sub.close()
    checker.bad_frames(sub.frame_errors)
    for line in checker.report():
        print(line)
    return 0 if checker.conformant else 1
