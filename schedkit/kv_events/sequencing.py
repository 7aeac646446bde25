"""The sequencing state of a KV-event subscriber: the last seq delivered, the last live seq
seen and the publisher's epoch, and how a live frame moves them once the replay socket's
answers for it (its epoch, the batches it showed missing) are in hand. Gaps, lost history and
restarts become notices; batches are delivered in seq order without duplicates.

``StreamSequencing`` is the base of ``KvEventSubscriber``; the subscriber provides the sockets
(``_ask`` a question on the replay socket, ``_drain_live`` the live queue) and the exchange
that collects the answers (``schedkit.kv_events.replay_exchange``).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from schedkit.kv_events.bad_input import BadInput
from schedkit.kv_events.notices import (
    GapDetected,
    GapFilled,
    HistoryLost,
    Notice,
    PublisherRestarted,
)
from schedkit.kv_events.replay_client import REPLAY, ReplayClient, ReplayRequest
from schedkit.kv_events.structs import BlockStored, KVEventBatch

__all__ = ["SILENT", "UNASKED", "LiveFrame", "StreamSequencing", "payload_decoder"]

UNASKED = object()  # a live frame's epoch: no question asked
SILENT = object()  # a live frame's epoch: asked, not answered in time


class LiveFrame:
    """A live frame and what the replay socket answered so far for its handling."""

    __slots__ = ("epoch", "payload", "replay", "seq")

    def __init__(self, seq: int, payload: bytes) -> None:
        self.seq = seq
        self.payload = payload
        self.epoch: object = UNASKED  # or SILENT, or the end marker's payload
        self.replay: ReplayRequest | None = None


def payload_decoder(
    decode: Callable[[bytes], KVEventBatch], keep_tokens: bool
) -> Callable[[bytes], KVEventBatch | str]:
    """``decode`` returning why a payload is not a batch instead of raising; without
    ``keep_tokens`` every ``BlockStored`` comes with empty ``token_ids``."""

    def decode_payload(payload: bytes) -> KVEventBatch | str:
        try:
            batch = decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return str(exc)
        if not keep_tokens:
            for event in batch.events:
                if type(event) is BlockStored:
                    event.token_ids = []
        return batch

    return decode_payload


class StreamSequencing:
    """The sequencing state and its transitions (see the module docstring)."""

    _replay: ReplayClient | None
    _frame: LiveFrame | None
    _notice: Callable[[Notice], None]
    _decode_payload: Callable[[bytes], KVEventBatch | str]
    bad_input: BadInput

    def _init_sequencing(self) -> None:
        self._epoch: bytes | None = None
        self._last: int | None = None
        self._live_last: int | None = None

    @property
    def last_seq(self) -> int | None:
        """The last seq applied (None before the first batch or after a restart)."""
        return self._last

    def _ask(self, kind: str, *, start: int = 0, frame: LiveFrame | None = None) -> ReplayRequest:
        raise NotImplementedError

    def _drain_live(self, reconnected: bool) -> None:
        raise NotImplementedError

    def _new_epoch(self, epoch: object) -> bool:
        return isinstance(epoch, bytes) and bool(epoch) and self._epoch not in (None, epoch)

    def _on_live(self, seq: int, payload: bytes, out: list) -> None:
        """Handle one live frame, with what the replay socket answered for it in hand."""
        frame = self._frame if self._frame is not None and self._frame.seq == seq else None
        epoch = None if frame is None or not isinstance(frame.epoch, bytes) else frame.epoch
        replay = None if frame is None else frame.replay
        live_last = self._live_last
        went_back = live_last is not None and seq <= live_last
        if self._new_epoch(epoch):
            self._new_publisher(seq, payload, epoch, replay, went_back, out)
            return
        if went_back:
            if epoch is not None and epoch == self._epoch:
                return  # the same publisher: a duplicate or a late, reordered frame
            last = self._last if self._last is not None else live_last
            self._notice(PublisherRestarted(last, seq))
            self._last = None
        self._live_last = seq
        if epoch and self._epoch is None:
            self._epoch = epoch
        last = self._last
        if last is not None and seq <= last:  # already delivered by a replay
            return
        expected = 0 if last is None else last + 1
        if seq == expected:
            self._apply(seq, payload, out)
            return
        if self._replay is None:
            self._notice(HistoryLost(expected, None))
        else:
            if last is not None:
                self._notice(GapDetected(expected, seq))
            self._replayed(replay, expected, seq, out)
        if self._last is None or seq > self._last:
            self._apply(seq, payload, out)

    def _new_publisher(
        self,
        seq: int,
        payload: bytes,
        epoch: bytes,
        replay: ReplayRequest | None,
        went_back: bool,
        out: list,
    ) -> None:
        """The replay socket names a new epoch for live frame ``seq``: report the restart and
        apply the new publisher's replay from 0."""
        last = self._last if self._last is not None else self._live_last
        if last is not None:
            self._notice(PublisherRestarted(last, seq, "seq" if went_back else "epoch"))
        self._epoch = epoch
        self._last = self._live_last = None
        self._replayed(replay, 0, seq if went_back else None, out)
        if went_back and (self._last is None or seq > self._last):
            self._apply(seq, payload, out)
        self._live_last = self._last
        if not went_back:
            # The frame came after a gap: it, and what is queued behind it, may be the old
            # publisher's tail. What the new one sent since the replay was answered is
            # queued there too, so it is asked for again once the queue is dropped.
            self._drain_live(reconnected=False)
            self._ask(REPLAY, start=0 if self._last is None else self._last + 1)

    def _restarted(self, epoch: bytes, reconnected: bool) -> None:
        """A new publisher answers an epoch check (``reconnected``: the one asked when the
        live socket connected again): drop what is queued live (the old one's tail may be
        there) and replay the new one from 0; the restart is reported with the replay, before
        its batches."""
        last = self._last
        self._epoch = epoch
        self._last = self._live_last = None
        self._frame = None  # answers still due for it are ignored
        self._drain_live(reconnected)
        self._ask(REPLAY, start=0).restart = last

    def _replayed(
        self, request: ReplayRequest | None, expected: int, received: int | None, out: list
    ) -> None:
        """Apply a replay's replies (None: none came) from ``expected`` on and report what
        stayed missing before ``received``, the live seq that showed the gap."""
        replies = [] if request is None else request.replies
        if request is not None and request.restart is not None:
            new_seq = replies[-1][0] if replies else 0  # the new publisher's last, as told
            self._notice(PublisherRestarted(request.restart, new_seq, "epoch"))
        lost = False
        for seq, payload, decoded in replies:
            if self._last is not None and seq <= self._last:
                continue
            due = expected if self._last is None else self._last + 1
            if seq != due:
                self._notice(HistoryLost(due, seq))
                lost = True
            self._apply(seq, payload, out, decoded)
        if received is not None:
            if self._last is None or self._last + 1 < received:
                due = expected if self._last is None else self._last + 1
                self._notice(HistoryLost(due, None, cut=request is not None and request.cut))
            elif not lost and received > expected:
                self._notice(GapFilled(expected, received - 1))

    def _apply(self, seq: int, payload: bytes, out: list, decoded: object = None) -> None:
        """Deliver ``seq`` (``decoded``: its batch or decode error, when a replay's read
        decoded it already)."""
        self._last = seq
        if decoded is None:
            decoded = self._decode_payload(payload)
        if isinstance(decoded, str):
            self.bad_input("payload", seq=seq, error=decoded)
        else:
            out.append((seq, decoded))
