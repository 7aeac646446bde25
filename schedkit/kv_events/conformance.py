"""Checking a KV-event stream the way a router relies on it.

A ``StreamChecker`` sees the stream twice, in the order a subscriber handles it (a
``CheckedSubscriber`` feeds it): every live frame as it arrives, before recovery reorders,
drops or replays anything, and every batch of the recovered stream with its payload as sent,
with the subscriber's notices in between. The rules:

- each payload is what the named profile's engine sends (``wire_shape``);
- the live seqs of one publisher only go up: a seq received again is duplicated (the same
  payload) or rewound (another payload), one that comes after a higher seq is reordered. A
  publisher restart is no fault: with a replay socket its epoch tells it, without one only a
  seq going back to 0 counts as one;
- no history is lost for good;
- every batch carries the stream's rank (``dp_rank``, else the first batch's);
- parents are stored before children, removed pages were stored, a BlockStored holds
  ``block_size`` tokens per hash, and under SGLang's profiles no page is stored twice
  (``page_rules``: per KV-cache group and medium, vLLM's pages counted in copies, at most
  ``max_pages`` held).

Problems are reported by cause: page problems that come after lost history, after a payload
that did not decode, or after a live anomaly the recovered stream could not undo, count under
that cause until the page set is known again (``AllBlocksCleared``, a publisher restart). More
problems of one kind share a line; a stream of another profile is said in one line.
"""

from __future__ import annotations

import contextlib

import msgspec

from schedkit.kv_events.findings import Findings
from schedkit.kv_events.page_rules import DEFAULT_MAX_CHECKED_PAGES, PageRules
from schedkit.kv_events.structs import (
    PROFILES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
)
from schedkit.kv_events.subscriber import HistoryLost, KvEventSubscriber, Notice, PublisherRestarted
from schedkit.kv_events.wire_shape import shape_problems

__all__ = ["CheckedSubscriber", "StreamChecker"]

_SEEN_LIMIT = 100_000  # live seqs remembered to tell a duplicate from a rewind


class StreamChecker:
    """Follows one rank's stream and keeps what breaks the rules in ``findings``;
    ``conformant`` when batches came and nothing broke."""

    def __init__(
        self,
        profile: str = "sglang",
        *,
        dp_rank: int | None = None,
        has_replay: bool = True,
        max_pages: int = DEFAULT_MAX_CHECKED_PAGES,
    ) -> None:
        self.profile = profile
        self.dp_rank = dp_rank
        self.has_replay = has_replay
        self.batches = 0
        self.events = 0
        self.findings = Findings()
        self.pages = PageRules(self.findings, profile=profile, max_pages=max_pages)
        self._misfits = dict.fromkeys(PROFILES, 0)  # payloads each profile does not send
        self._seen: dict[int, int] = {}  # live seq -> payload hash, this publisher
        self._live_top: int | None = None
        self._live: tuple[int, bytes] | None = None  # the live frame being handled
        self._restarted = False
        self._live_applied = False

    # -- what the subscriber shows --------------------------------------------------------

    def begin_live(self, seq: int, payload: bytes) -> None:
        """A live frame arrived; what the subscriber does with it comes next."""
        self._live = (seq, payload)
        self._restarted = self._live_applied = False
        self.findings.hold()

    def end_live(self) -> None:
        """The subscriber is done with the live frame: judge its place in the live order.
        An anomaly is the cause of whatever its handling turned up."""
        seq, payload = self._live
        self._live = None
        anomaly = self._order(seq, payload)
        if anomaly is None:
            self.findings.release()
            return
        # The page set is incomplete after it if the subscriber started over or dropped new
        # content under an old seq.
        kind, text = anomaly
        self.findings.release((kind, seq, text, self._restarted or kind == "rewound"))
        if not self._live_applied:
            # Undecodable: the recovered stream has this seq's payload and reports it.
            with contextlib.suppress(msgspec.DecodeError):
                self._check_rank(seq, decode_batch(payload))

    def notice(self, notice: Notice) -> None:
        """What the subscriber noticed: lost history is a cause; a restart starts the page
        set over (and, outside a live frame, the live order)."""
        if isinstance(notice, HistoryLost):
            self.findings.record("lost", notice.expected, self._lost(notice), cause=True)
        elif isinstance(notice, PublisherRestarted):
            self.pages.known_again(None)
            self.findings.known_again()
            if self._live is None:
                self._seen.clear()
                self._live_top = None
            else:
                self._restarted = True

    def apply(self, seq: int, payload: bytes, batch: KVEventBatch | None) -> None:
        """Check one batch of the recovered stream (None: its payload did not decode)."""
        if self._live is not None and seq == self._live[0]:
            self._live_applied = True
        shapes = shape_problems(payload)
        for name, problem in shapes.items():
            self._misfits[name] += problem is not None
        if shapes[self.profile] is not None:
            text = f"seq {seq}: not what {self.profile} sends: {shapes[self.profile]}"
            self.findings.record("shape", seq, text, follows=False, cause=batch is None)
        if batch is None:
            return
        self.batches += 1
        self._check_rank(seq, batch)
        for event in batch.events:
            self.events += 1
            if type(event) is BlockStored:
                self.pages.stored(seq, event)
            elif type(event) is BlockRemoved:
                self.pages.removed(seq, event)
            elif type(event) is AllBlocksCleared:
                self.pages.known_again(seq)
                self.findings.known_again()

    def bad_frames(self, count: int) -> None:
        """``count`` live messages were not ``[topic, 8-byte seq, payload]``."""
        if count:
            text = f"{count} messages not framed as [topic, 8-byte seq, payload]"
            self.findings.add("frames", text)

    # -- the rules ------------------------------------------------------------------------

    def _order(self, seq: int, payload: bytes) -> tuple[str, str] | None:
        """Where a live seq stands against those before it: None when in order (or a
        restart), else the anomaly's kind and text."""
        digest, top = hash(payload), self._live_top
        if top is not None and seq <= top:
            previous = self._seen.get(seq)
            if previous == digest:
                return "duplicated", f"seq {seq} received twice (the same payload again)"
            if not (self._restarted and (self.has_replay or seq == 0)):
                if previous is not None:
                    return "rewound", f"seq {seq} received again with another payload"
                return "reordered", f"seq {seq} arrived after seq {top} (reordered)"
        if self._restarted:  # a new publisher: its seqs start over
            self._seen.clear()
        self._seen[seq] = digest
        if len(self._seen) > _SEEN_LIMIT:
            del self._seen[next(iter(self._seen))]
        self._live_top = seq
        return None

    def _check_rank(self, seq: int, batch: KVEventBatch) -> None:
        rank = batch.attn_dp_rank
        if self.dp_rank is None:
            self.dp_rank = rank
        elif rank != self.dp_rank:
            text = f"seq {seq}: attn_dp_rank {rank}, the stream's rank is {self.dp_rank}"
            self.findings.record("rank", seq, text, follows=False)

    def _lost(self, notice: HistoryLost) -> str:
        first = notice.expected
        if notice.replay_start is not None:
            return (
                f"{_seqs(first, notice.replay_start - 1)} lost: the replay's history starts "
                f"at seq {notice.replay_start}"
            )
        if self.has_replay:
            return f"seq {first} onwards lost: the replay did not have it"
        if self._live is None or self._live[0] <= first:
            return f"seq {first} onwards lost (no replay endpoint)"
        last = self._live[0] - 1
        if first == 0 and self._live_top is not None:  # the subscriber started over
            return f"started over at seq {last + 1} as after a restart: {_seqs(0, last)} missing"
        if first == 0:
            what = f"the first seq seen was {last + 1}: {_seqs(0, last)} not seen"
            return f"{what}; a replay endpoint (--replay) would recover the start"
        them = "it" if first == last else "them"
        return f"{_seqs(first, last)} missed; a replay endpoint (--replay) would recover {them}"

    # -- verdict --------------------------------------------------------------------------

    @property
    def stream_profile(self) -> str | None:
        """The profile every payload was sent as, when it is not the one checked for."""
        if not self._misfits[self.profile]:
            return None
        return next((name for name in PROFILES if not self._misfits[name]), None)

    @property
    def problem_count(self) -> int:
        """Problems found, not counting those that follow from another."""
        return self.findings.count

    @property
    def conformant(self) -> bool:
        """True when batches arrived and none broke a rule."""
        return self.batches > 0 and not self.findings

    def report(self) -> list[str]:
        """The verdict and what broke, causes first, as lines to print."""
        other = self.stream_profile
        if other is not None:
            return [
                f"NOT conformant: the stream decodes as profile {other}, not {self.profile}; "
                f"rerun with --profile {other}"
            ]
        follow = self.findings.follow
        problems = f"{self.problem_count} problems"
        if follow:
            problems += f" (+{follow} that follow from them)"
        verdict = "conformant" if self.conformant else "NOT conformant"
        if self.pages.partial:
            verdict += " (pages checked in part)"
        lines = [
            f"{verdict}: {self.batches} batches, {self.events} events, {problems}, "
            f"{self.pages.pages_held} pages held"
        ]
        if self.batches == 0:
            lines.append("  no batch arrived")
        return lines + self.pages.lines() + self.findings.lines()


def _seqs(first: int, last: int) -> str:
    return f"seq {first}" if first >= last else f"seqs {first}..{last}"


class CheckedSubscriber(KvEventSubscriber):
    """A ``KvEventSubscriber`` that shows ``checker`` each live frame as it arrives and each
    batch it applies, with its payload, at the moment it handles them. It decodes every
    profile, so that a stream of another profile still shows its pages; the checker judges
    the encoding."""

    _keeps_payloads = True

    def __init__(self, checker: StreamChecker, endpoint: str, *args: object, **kwargs: object):
        super().__init__(endpoint, *args, on_notice=checker.notice, **kwargs)
        self.checker = checker

    def _on_live(self, seq: int, payload: bytes, out: list) -> None:
        self.checker.begin_live(seq, payload)
        try:
            super()._on_live(seq, payload, out)
        finally:
            self.checker.end_live()

    def _apply(self, seq: int, payload: bytes, out: list, decoded: object = None) -> None:
        errors = self.decode_errors
        super()._apply(seq, payload, out, decoded)
        self.checker.apply(seq, payload, out[-1][1] if self.decode_errors == errors else None)
