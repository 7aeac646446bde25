"""What a KV-event subscriber tells its consumer about the stream besides its batches: gaps,
replays that filled them, history that is gone for good, and publisher restarts."""

from __future__ import annotations

import attrs

__all__ = ["GapDetected", "GapFilled", "HistoryLost", "Notice", "PublisherRestarted"]


@attrs.frozen
class GapDetected:
    """Live seq ``received`` arrived while ``expected`` was due; the replay's outcome follows
    (``GapFilled`` or ``HistoryLost``)."""

    expected: int
    received: int


@attrs.frozen
class GapFilled:
    """The replay delivered every missing seq from ``start`` to ``end`` inclusive."""

    start: int
    end: int


@attrs.frozen
class HistoryLost:
    """Batches from ``expected`` on cannot be recovered; state built so far is incomplete.

    ``replay_start`` is the first seq the replay offered, or None when there was no replay
    or it had nothing. ``cut`` is True when the replay's answer went past the subscriber's
    bounds (``ReplayBounds``: batches, bytes or seconds per request) and was cut there. A
    consumer should clear what it built from this stream and go on.
    """

    expected: int
    replay_start: int | None
    cut: bool = False


@attrs.frozen
class PublisherRestarted:
    """A new publisher took over after ``last_seq``: its seq went back (``reason`` "seq",
    ``new_seq`` the seq received), or its replay socket names another epoch (``reason``
    "epoch", ``new_seq`` the live seq at hand when it was noticed, or without one the last
    seq the new publisher's replay held). What was built from the old publisher is void;
    start over."""

    last_seq: int
    new_seq: int
    reason: str = "seq"


Notice = GapDetected | GapFilled | HistoryLost | PublisherRestarted
