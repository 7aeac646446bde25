"""The columns of a decode batch's streamed messages that stay put while its requests do.

Between two decode steps the running batch is usually the same requests in the same order: the
request ids, prompt lengths and cache hits of its messages do not change, only the new tokens,
the completion counts and the finish reasons. ``SteadyStream`` keeps those columns for a batch
seen at two decode steps in a row (a list comparison, by identity, at C speed) when each of
its requests streams every token or none streams, and for the latter files each request under
the step at which its output length next reaches a multiple of the forced interval.

Each request's ``send_token_offset`` is part of what is kept: at a step that streams every
token the streamer records the output lengths it sent (``SteadyColumns.sent``) instead of
writing them into 256 requests, and the kept batch writes them when it stops being kept (the
batch changes, a request finishes or is streamed outside a decode step), before anything reads
them (an offset something else wrote meanwhile, necessarily a later one, is kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, repeat
from operator import attrgetter, not_

from schedkit.core.schedule_batch import Req

__all__ = ["EVERY_TOKEN", "NOT_STREAMING", "SteadyColumns", "SteadyStream"]

_SEND_OFFSET = attrgetter("send_token_offset")

# What the batch's requests have in common: each streams every token, or none streams.
EVERY_TOKEN = 1
NOT_STREAMING = 2


class SteadyColumns:
    """The unchanging columns of one decode batch's messages, and (none streaming) which
    of its requests are due at which of its steps."""

    __slots__ = (
        "_due",
        "_position",
        "cached_tokens",
        "details",
        "kind",
        "member_set",
        "members",
        "outputs",
        "prompt_tokens",
        "rids",
        "sent",
        "step",
        "storage_enabled",
        "wire",
    )

    def __init__(self, reqs: list[Req], kind: int, force_interval: int) -> None:
        self.members = list(reqs)
        self.member_set = set(reqs)
        self.kind = kind
        self.outputs = [req.output_ids for req in reqs]
        self.rids = [req.rid for req in reqs]
        self.prompt_tokens = [len(req.origin_input_ids) for req in reqs]
        self.cached_tokens = [req.cached_tokens for req in reqs]
        self.details: list[dict | None] | None = None
        self.storage_enabled: bool | None = None
        # The encoded columns (token_wire.encode_columns), made at the first encoded send.
        self.wire: tuple | None = None
        # Each member's output length at the last message sent, not yet its send_token_offset.
        self.sent: list[int] | None = None
        self._position: dict[Req, int] | None = None
        # Steps seen with these columns; step -> requests whose output length reaches a
        # multiple of the forced interval at that step (none streaming).
        self.step = 0
        self._due: dict[int, list[Req]] = {}
        if kind == NOT_STREAMING:
            for req, output in zip(reqs, self.outputs, strict=True):
                self._due.setdefault(-len(output) % force_interval, []).append(req)

    def advance(self, force_interval: int) -> Sequence[Req]:
        """Count one decode step (each request got one token); the requests whose output
        length is a multiple of ``force_interval`` now (none streaming)."""
        step = self.step
        self.step = step + 1
        due = self._due.pop(step, None)
        if due is None:
            return ()
        later = self._due.setdefault(step + force_interval, [])
        later += due
        return due

    def settle(self) -> None:
        """Write each member's ``send_token_offset`` from ``sent`` (if pending)."""
        sent = self.sent
        if sent is not None:
            self.sent = None
            members = self.members
            # An offset written meanwhile by other code (a later one, never lower) is kept.
            offsets = map(max, map(_SEND_OFFSET, members), sent)
            any(map(setattr, members, repeat("send_token_offset"), offsets))  # returns None

    def quiet_steps(self, limit: int) -> int:
        """How many of the next ``limit`` steps find no request due (none streaming; every
        step streams when each request streams every token)."""
        due = self._due
        if self.kind != NOT_STREAMING or not due:
            return limit
        return min(limit, min(due) - self.step)

    def without(self, gone: list[Req], force_interval: int) -> SteadyColumns:
        """These columns less the requests ``gone`` (finished at this step): the batch the
        scheduler runs next. Filtered in C, no request looked at but those gone (whose
        offsets are written)."""
        gone_set = set(gone)
        keep = list(map(not_, map(gone_set.__contains__, self.members)))
        columns = SteadyColumns.__new__(SteadyColumns)
        sent, self.sent = self.sent, None
        columns.sent = None if sent is None else list(compress(sent, keep))
        if sent is not None:
            for req, length in compress(zip(self.members, sent, strict=True), map(not_, keep)):
                req.send_token_offset = max(req.send_token_offset, length)
        columns.members = list(compress(self.members, keep))
        columns.member_set = self.member_set - gone_set
        columns.kind = self.kind
        columns.outputs = list(compress(self.outputs, keep))
        columns.rids = list(compress(self.rids, keep))
        columns.prompt_tokens = list(compress(self.prompt_tokens, keep))
        columns.cached_tokens = list(compress(self.cached_tokens, keep))
        columns.details = None if self.details is None else list(compress(self.details, keep))
        columns.storage_enabled = self.storage_enabled
        columns.wire = None
        columns._position = None
        columns.step = self.step
        columns._due = self._due
        if self.kind == NOT_STREAMING:
            for req in gone:  # where it is filed: its next step at a multiple of the interval
                at = self.step + -(len(req.output_ids) + 1) % force_interval
                filed = self._due.get(at)
                if filed is not None and req in filed:
                    filed.remove(req)
        self._due = {}
        return columns

    def in_batch_order(self, reqs: list[Req]) -> list[Req]:
        """``reqs`` (members) in the order of the batch, each once."""
        if len(reqs) < 2:
            return reqs
        reqs = list(dict.fromkeys(reqs))
        if self._position is None:
            self._position = dict(zip(self.members, range(len(self.members)), strict=True))
        return sorted(reqs, key=self._position.__getitem__)


class SteadyStream:
    """The columns of the last decode batch seen twice in a row, or None."""

    __slots__ = ("_columns", "_seen")

    def __init__(self) -> None:
        self._columns: SteadyColumns | None = None
        self._seen: list[Req] | None = None

    def columns(
        self, reqs: list[Req], default_interval: int, force_interval: int
    ) -> SteadyColumns | None:
        """The columns of ``reqs`` when it is the batch of the previous decode step too and
        its requests all stream every token or none streams; None otherwise."""
        columns = self._columns
        if columns is not None:
            if reqs == columns.members:
                return columns
            columns.settle()
            self._columns = None
        if reqs != self._seen:
            self._seen = list(reqs)
            return None
        self._seen = None
        kind = _kind(reqs, default_interval)
        if kind is not None:
            self._columns = SteadyColumns(reqs, kind, force_interval)
        return self._columns

    def kept(self, reqs: list[Req]) -> SteadyColumns | None:
        """The columns kept for ``reqs`` (the batch of the previous decode step), or None."""
        columns = self._columns
        return columns if columns is not None and reqs == columns.members else None

    def start_run(
        self, reqs: list[Req], default_interval: int, force_interval: int
    ) -> SteadyColumns | None:
        """Columns for ``reqs`` (not the kept batch) before a run of decode steps, when each
        of its requests streams every token, is unfinished and has sent every token it has:
        then each step sends one new token of each, what the columns stream. None (what was
        kept written out and dropped, as the next ``columns`` call would) otherwise."""
        kept = self._columns
        if kept is not None:
            if reqs == kept.members:
                return kept
            kept.settle()
            self._columns = None
        if _kind(reqs, default_interval) != EVERY_TOKEN:
            return None
        for req in reqs:
            if req.finished_reason is not None or req.send_token_offset != len(req.output_ids):
                return None
        self._columns = SteadyColumns(reqs, EVERY_TOKEN, force_interval)
        self._seen = None
        return self._columns

    def keep_without(self, columns: SteadyColumns, gone: list[Req], force_interval: int) -> None:
        """Keep ``columns`` less the requests ``gone`` (finished at this step)."""
        self._columns = columns.without(gone, force_interval)
        self._seen = None

    def forget_any(self, reqs: list[Req]) -> None:
        """Keep nothing if ``reqs`` shares a request with what is kept (it is streamed
        outside a decode step)."""
        columns = self._columns
        if columns is not None and not columns.member_set.isdisjoint(reqs):
            self.forget()

    def forget(self) -> None:
        """Keep nothing (a request finished: it must not be held)."""
        if self._columns is not None:
            self._columns.settle()
        self._columns = None
        self._seen = None


def _kind(reqs: list[Req], default_interval: int) -> int | None:
    streaming = 0
    for req in reqs:
        params = req.sampling_params
        if params.stream:
            if (params.stream_interval or default_interval) != 1:
                return None
            streaming += 1
    if streaming == len(reqs):
        return EVERY_TOKEN
    return NOT_STREAMING if streaming == 0 else None
