"""A scheduling policy of one's own: least new work first."""

from __future__ import annotations

from typing import Any

from schedkit import component
from schedkit.core.schedule_batch import Req

__all__ = ["ShortestUncachedFirst"]


@component("shortest_uncached_first")
class ShortestUncachedFirst:
    """Admit first the requests with the fewest tokens left to compute.

    A request's new work is its prompt (and output so far) less the prefix ``tree_cache``
    already holds, so short questions and those that mostly hit the cache go ahead of long
    uncached prompts: shortest-job-first for prefill, aware of the prefix cache. Ties keep
    arrival order. Above ``max_queue_for_prefix_match`` waiting requests the cache is not
    consulted and the queue is sorted by length alone.
    """

    tree_cache: Any
    max_queue_for_prefix_match: int = 128

    def __attrs_post_init__(self) -> None:
        if self.max_queue_for_prefix_match < 0:
            raise ValueError(
                f"max_queue_for_prefix_match must be >= 0, got {self.max_queue_for_prefix_match}"
            )

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort ``waiting_queue`` in place by tokens left to compute, fewest first."""
        if len(waiting_queue) > self.max_queue_for_prefix_match:
            waiting_queue.sort(key=_seqlen)
            return
        match_prefix = self.tree_cache.match_prefix
        for req in waiting_queue:
            # The last token is always computed (its logits give the next token).
            req.prefix_len = len(match_prefix(req.fill_ids[:-1]).device_indices)
        waiting_queue.sort(key=_new_tokens)


def _seqlen(req: Req) -> int:
    return req.seqlen


def _new_tokens(req: Req) -> int:
    return req.seqlen - req.prefix_len
