"""The columns of a streamed batch message that stay put while the batch's requests do.

Between two decode steps the running batch is usually the same requests in the same order: the
request ids, prompt lengths and cache hits of its messages do not change, only the new tokens,
the completion counts and the finish reasons. ``SteadyStream`` keeps those columns for the
batch seen twice in a row (a list comparison, by identity, at C speed), with what decides
which of its requests are due: all of them streaming every token, or none streaming.
"""

from __future__ import annotations

from collections.abc import Callable

from schedkit.core.schedule_batch import Req

__all__ = ["EVERY_TOKEN", "NOT_STREAMING", "SteadyColumns", "SteadyStream"]

# What the batch's requests have in common: each streams every token, or none streams.
EVERY_TOKEN = 1
NOT_STREAMING = 2


class SteadyColumns:
    """The unchanging columns of one batch's messages."""

    __slots__ = (
        "cached_tokens",
        "details",
        "kind",
        "members",
        "outputs",
        "prompt_tokens",
        "rids",
        "storage_enabled",
    )

    def __init__(self, reqs: list[Req], kind: int) -> None:
        self.members = list(reqs)
        self.kind = kind
        self.outputs = [req.output_ids for req in reqs]
        self.rids = [req.rid for req in reqs]
        self.prompt_tokens = [len(req.origin_input_ids) for req in reqs]
        self.cached_tokens = [req.cached_tokens for req in reqs]
        self.details: list[dict | None] | None = None
        self.storage_enabled: bool | None = None


class SteadyStream:
    """The columns of the last batch streamed twice in a row, or None."""

    __slots__ = ("_columns", "_seen")

    def __init__(self) -> None:
        self._columns: SteadyColumns | None = None
        self._seen: list[Req] | None = None

    def columns(self, reqs: list[Req], default_interval: int) -> SteadyColumns | None:
        """The columns of ``reqs`` when it is the batch of the previous call too and its
        requests all stream every token or none streams; None otherwise."""
        columns = self._columns
        if columns is not None and reqs == columns.members:
            return columns
        self._columns = None
        if reqs != self._seen:
            self._seen = list(reqs)
            return None
        self._seen = None
        kind = _kind(reqs, default_interval)
        if kind is not None:
            self._columns = SteadyColumns(reqs, kind)
        return self._columns

    def details(
        self,
        columns: SteadyColumns,
        storage_enabled: bool,
        build: Callable[[list[Req]], list[dict | None]],
    ) -> list[dict | None]:
        """The batch's cached-token details for this value of the storage flag."""
        if columns.details is None or columns.storage_enabled != storage_enabled:
            columns.details = build(columns.members)
            columns.storage_enabled = storage_enabled
        return columns.details

    def forget(self) -> None:
        """Keep nothing (a request finished: it must not be held)."""
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
