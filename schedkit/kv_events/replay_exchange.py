"""A KV-event subscriber's exchange with the publisher's replay socket: which question a live
frame raises before it can be judged (the publisher's epoch, the batches it shows missing),
and what each answer, or its absence, does to the frame and the sequencing state.

``ReplayExchange`` sits between ``StreamSequencing`` (the state) and ``SubscriberSockets``
(the sockets); the requests themselves go through ``ReplayClient``.
"""

from __future__ import annotations

import time

import structlog

from schedkit.kv_events.replay_client import (
    CHECK,
    GAP,
    JUDGE,
    LEARN,
    RECONNECT,
    REPLAY,
    ReplayRequest,
)
from schedkit.kv_events.sequencing import SILENT, UNASKED, LiveFrame, StreamSequencing

__all__ = ["ReplayExchange"]

log = structlog.get_logger("schedkit.kv_events.subscriber")


class ReplayExchange(StreamSequencing):
    """Questions and answers on the replay socket for the pending live frame."""

    replay_endpoint: str | None
    _epoch_told: bool | None
    _epoch_interval: float
    _epoch_checked: float
    _work_until: float

    def _prepare(self, out: list) -> None:
        """Ask the next question the pending live frame raises, or handle it if none is left."""
        frame = self._frame
        if frame.epoch is UNASKED:
            question = self._epoch_question(frame.seq)
            if question is not None:
                self._ask(question, frame=frame)
                return
        if frame.replay is None and frame.epoch is not SILENT:
            start = self._replay_start(frame.seq, frame.epoch)
            if start is not None:
                self._ask(REPLAY, start=start, frame=frame)
                return
        self._on_live(frame.seq, frame.payload, out)
        self._frame = None

    def _epoch_question(self, seq: int) -> str | None:
        """Why live frame ``seq`` needs the publisher's epoch before it is judged, if it does."""
        if self._replay is None:
            return None
        if self._epoch_told is None:
            return LEARN
        if self._epoch is None:
            return None
        live_last, last = self._live_last, self._last
        if live_last is not None and seq <= live_last:
            return JUDGE
        return GAP if seq > (0 if last is None else last + 1) else None

    def _replay_start(self, seq: int, epoch: object) -> int | None:
        """Where the replay that live frame ``seq`` needs starts (None: it needs none), as
        ``_on_live`` will judge it with ``epoch``."""
        if self._replay is None:
            return None
        if self._new_epoch(epoch):
            return 0
        live_last, last = self._live_last, self._last
        if live_last is not None and seq <= live_last:
            if epoch == self._epoch:
                return None  # seen already
            last = None  # a restart
        expected = 0 if last is None else last + 1
        return expected if seq > expected else None

    def _epoch_check_due(self, now: float) -> bool:
        return (
            self._replay is not None
            and not self._replay.requests
            and self._live_last is not None
            and now - self._epoch_checked >= self._epoch_interval
        )

    def _ask(self, kind: str, *, start: int = 0, frame: LiveFrame | None = None) -> ReplayRequest:
        """Send a request; its answer is handled by a later ``_take_answers``."""
        request = self._replay.ask(kind, start=start, frame=frame)
        if kind == REPLAY:
            if frame is not None:
                frame.replay = request
        else:
            self._epoch_checked = time.monotonic()
        return request

    def _take_answers(self, out: list) -> bool:
        """Read what the replay socket answered, act on each answer in request order, give
        up on requests unanswered in time (or cut at their bounds), and send the periodic
        epoch check when due. False when an answer that reveals a restart waits for the next
        ``poll`` call."""
        replay = self._replay
        if replay is None:
            return True
        requests = replay.requests
        if requests and replay.read(self._work_until):
            # An answer was cut: the rest of it would be taken for the next request's.
            self._abandon(replay.give_up(), out)
        while requests:
            request = requests[0]
            if not request.answered:
                why = replay.overdue(request, time.monotonic())
                if why is None:
                    break
                if why == "cut":
                    replay.cut(request, "its answer did not end in time")
                else:
                    log.warning(
                        "kv_events.replay_timeout",
                        endpoint=self.replay_endpoint,
                        request=request.kind,
                        received=len(request.replies),
                    )
                self._abandon(replay.give_up(), out)
                continue
            if request.frame is None and out and self._new_epoch(request.answer):
                return False  # report the restart before any batch of a poll
            self._answered(replay.pop(), out)
        if self._epoch_check_due(time.monotonic()):
            self._ask(CHECK)
        return True

    def _abandon(self, requests: list[ReplayRequest], out: list) -> None:
        """Act on requests given up on: a cut replay with what it delivered, the others as
        not answered."""
        for request in requests:
            if request.cut and request.kind != REPLAY:
                request.answered = False  # an epoch answer that never ended: none
            self._answered(request, out)

    def _answered(self, request: ReplayRequest, out: list) -> None:
        """Act on a request taken off the queue, answered or given up on."""
        # The frame links back to its replay request: without this link cut, the pair is a
        # reference cycle that keeps the replay's decoded replies (up to ReplayBounds) alive
        # until a full garbage collection, one more set per replay.
        frame, request.frame = request.frame, None
        if request.kind == REPLAY:
            if frame is None:
                self._replayed(request, 0, None, out)  # a new publisher's stream
            elif frame is self._frame:
                self._prepare(out)
            return
        answer = request.answer if request.answered else None
        if answer is not None:
            self._epoch_told = bool(answer)
        elif frame is not None and self._epoch_told is None:
            self._epoch_told = False  # a frame waited in vain: do not make the next wait too
        if frame is not None:
            if frame is self._frame:
                self._frame.epoch = SILENT if answer is None else answer
                self._prepare(out)
        elif self._new_epoch(answer):
            self._restarted(answer, request.kind == RECONNECT)
        else:
            if answer and self._epoch is None:
                self._epoch = answer
            if request.kind == RECONNECT and answer is not None:
                # What went out while the live socket was away (a restart's first batches
                # after its replay, say) is in the replay ring; no later frame may show it.
                self._ask(REPLAY, start=0 if self._last is None else self._last + 1)
