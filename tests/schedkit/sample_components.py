"""Small components for testing the wiring machinery."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs

from schedkit import component

EVENTS: list[str] = []


class Named(Protocol):
    name: str


@component("sample_counter")
class Counter:
    """Holds a value that changes at run time."""

    start: int = 0
    step: float = 1.0
    tags: list[str] = attrs.Factory(list)
    value: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.value = self.start

    def bump(self, by: int = 1) -> int:
        self.value += by
        return self.value


@component("sample_reader")
class Reader:
    """Reads a counter eagerly and late."""

    get_value: Callable[[], int]
    bump: Callable[..., int] | None = None
    counter: Counter | None = None
    peer: Named | None = None
    anything: Any = None
    name: str = "reader"


@component("sample_pair", frozen=True)
class Pair:
    """A frozen component holding two references (for list/dict injection)."""

    items: list[object] = attrs.Factory(list)
    by_name: dict[str, object] = attrs.Factory(dict)


@component("sample_exploding")
class Exploding:
    """Raises from its constructor."""

    fuse: int = 0

    def __attrs_post_init__(self) -> None:
        raise RuntimeError(f"boom after {self.fuse}")


@component("sample_closable")
class Closable:
    """Records its shutdown and close calls in EVENTS."""

    label: str
    before: Closable | None = None
    fail: bool = False

    def shutdown(self) -> None:
        EVENTS.append(f"shutdown {self.label}")
        if self.fail:
            raise RuntimeError(f"{self.label} failed to stop")


@component("sample_close_only")
class CloseOnly:
    """Only has close()."""

    label: str = "close-only"

    def close(self) -> None:
        EVENTS.append(f"close {self.label}")


class NotAComponent:
    """A plain class: must never be built from a wiring file."""

    def __init__(self) -> None:
        EVENTS.append("NotAComponent constructed")


@component("sample_reads_at_build")
class ReadsAtBuild:
    """Calls its late getter while it is being built."""

    get_value: Callable[[], int]
    seen: int = 0

    def __attrs_post_init__(self) -> None:
        self.seen = self.get_value()


@attrs.define
class _CountingStats:
    gen_throughput: float = 0.0
    cache_hit_rate: float = 0.0


@component("sample_counting_reporter")
class CountingReporter:
    """A metrics reporter that only counts its calls (keeps no figure of its own)."""

    stats: _CountingStats = attrs.field(init=False, factory=_CountingStats)
    counts: dict = attrs.field(init=False, factory=dict)

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def report_prefill_stats(self, batch: object) -> None:
        self._count("report_prefill_stats")

    def report_decode_stats(self, batch: object) -> None:
        self._count("report_decode_stats")

    def increment_generated_tokens(self, n: int) -> None:
        self._count("increment_generated_tokens")

    def advance_forward_ct_decode(self) -> None:
        self._count("advance_forward_ct_decode")

    def maybe_log_idle_metrics(self) -> None:
        self._count("maybe_log_idle_metrics")

    def on_pause(self) -> None:
        self._count("on_pause")

    def observe_finished_request(self, req: object) -> None:
        self._count("observe_finished_request")


@component("sample_half_reporter")
class HalfReporter:
    """A metrics reporter missing most of the interface."""

    def report_prefill_stats(self, batch: object) -> None:
        return None


@component("sample_wrong_arity_reporter")
class WrongArityReporter(CountingReporter):
    """A metrics reporter with every member, two of them not callable as the protocol says."""

    def report_decode_stats(self) -> None:
        self._count("report_decode_stats")

    def increment_generated_tokens(self, n: int, step: int) -> None:
        self._count("increment_generated_tokens")
