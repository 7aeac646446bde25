"""What components need of each other: the interfaces a wiring's ``!ref`` targets must have.

Components annotate their collaborator fields with these protocols; ``schedkit validate``
checks that the component a ``!ref`` names has every member of the field's protocol, so a
wrong or incompatible component is reported at its file and line before anything is built.
Any class with the members fits: a fake in a test does not have to inherit from anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from schedkit.core.schedule_batch import GenerationBatchResult, ScheduleBatch

__all__ = [
    "Clock",
    "KVAllocator",
    "ModelRunner",
    "OutputSender",
    "PrefixCache",
    "RequestReceiver",
]


class KVAllocator(Protocol):
    """A pool of KV-cache slots handed out a page at a time."""

    size: int
    page_size: int

    def alloc(self, n: int) -> list[int] | None: ...
    def free(self, indices: Sequence[int]) -> None: ...
    def available_size(self) -> int: ...


class PrefixCache(Protocol):
    """A prefix cache the scheduler matches, locks, fills and evicts (radix or SWA).

    ``inc_lock_ref(node)`` returns a token that ``dec_lock_ref(node, token)`` takes back.
    """

    page_size: int
    disable: bool

    def match_prefix(self, key: Sequence[int]) -> Any: ...
    def insert(self, key: Sequence[int], value: Sequence[int] | None = None) -> int: ...
    def inc_lock_ref(self, node: Any) -> Any: ...
    def dec_lock_ref(self, node: Any, swa_uuid_for_lock: Any = None) -> Any: ...
    def evict(self, num_tokens: int) -> Any: ...
    def evictable_size(self) -> int: ...
    def protected_size(self) -> int: ...
    def total_size(self) -> int: ...
    def reset(self) -> None: ...
    def take_events(self) -> list: ...
    def cache_finished_req(self, req: Any) -> None: ...
    def cache_unfinished_req(self, req: Any) -> None: ...


class RequestReceiver(Protocol):
    """Where new requests and control requests come from; never blocks."""

    def recv_requests(self) -> list: ...


class OutputSender(Protocol):
    """Where the output streamer's batch messages go."""

    def send(self, msg: Any) -> None: ...


class Clock(Protocol):
    """The scheduler's time: virtual or wall seconds."""

    def now(self) -> float: ...


class ModelRunner(Clock, Protocol):
    """Runs one batch and returns its next tokens; owns the clock the scheduler reads."""

    def forward(self, batch: ScheduleBatch) -> GenerationBatchResult: ...
