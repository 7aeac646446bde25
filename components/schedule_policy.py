"""Scheduling policies: the order in which waiting requests are considered for prefill.

A policy sorts the waiting queue in place before each prefill batch is formed. ``fcfs`` keeps
the queue order (arrival order; the scheduler puts retracted requests back at the front).
``lpm`` (longest prefix match, SGLang's default) puts the requests with the longest cached
prefix first, so that they are admitted while their prefix is still in the cache.
"""

from __future__ import annotations

from typing import Any, Protocol

from schedkit.component import component
from schedkit.schedule_batch import Req

__all__ = ["FCFSPolicy", "LPMPolicy", "SchedulePolicy"]


class SchedulePolicy(Protocol):
    """What the scheduler needs from a policy."""

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort ``waiting_queue`` in place, first to be admitted first."""


@component("fcfs")
class FCFSPolicy:
    """First come, first served: the queue stays as it is."""

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Leave the queue in arrival order."""


@component("lpm")
class LPMPolicy:
    """Longest prefix match first.

    Each waiting request's prompt and output so far is matched against ``tree_cache`` (the
    match length is stored in ``req.prefix_len``) and the queue is sorted by that length,
    longest first; ties keep their order. Matching costs time linear in the queue, so above
    ``max_queue_for_prefix_match`` waiting requests the queue is left in FCFS order, as SGLang
    does above 128.
    """

    tree_cache: Any
    max_queue_for_prefix_match: int = 128

    def __attrs_post_init__(self) -> None:
        if self.max_queue_for_prefix_match < 0:
            raise ValueError(
                f"max_queue_for_prefix_match must be >= 0, got {self.max_queue_for_prefix_match}"
            )

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort by cached prefix length, longest first (FCFS above the queue threshold)."""
        if len(waiting_queue) > self.max_queue_for_prefix_match:
            return
        match_prefix = self.tree_cache.match_prefix
        for req in waiting_queue:
            # The last token is always computed (its logits give the next token).
            req.prefix_len = len(match_prefix(req.fill_ids[:-1]).device_indices)
        waiting_queue.sort(key=_neg_prefix_len)


def _neg_prefix_len(req: Req) -> int:
    return -req.prefix_len
