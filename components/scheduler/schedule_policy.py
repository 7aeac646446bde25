"""Scheduling policies: the order in which waiting requests are considered for prefill.

A policy sorts the waiting queue in place before each prefill batch is formed. ``fcfs`` keeps
the queue order (arrival order; the scheduler puts retracted requests back at the front).
``lpm`` (longest prefix match, SGLang's default) puts the requests with the longest cached
prefix first, so that they are admitted while their prefix is still in the cache, and holds
back requests that would recompute an uncached prefix another waiting request is about to
compute (in-batch prefix caching). ``priority`` sorts by ``Req.priority``. SGLang's other
policies are in ``cache_aware_policies`` (``dfs-weight``, ``hrrn``, ``shortest-prefill-first``)
and ``cache_agnostic_policies`` (``lof``, ``random``, ``routing-key``).
"""

from __future__ import annotations

import math
from typing import Any

from schedkit.components.cache.cache_keys import prefix_match_key
from schedkit.core.component import ArgumentError, component
from schedkit.core.protocols import PrefixCache, SchedulePolicy
from schedkit.core.schedule_batch import Req

__all__ = [
    "IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD",
    "IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD",
    "FCFSPolicy",
    "LPMPolicy",
    "PriorityPolicy",
    "SchedulePolicy",
    "match_waiting_prefixes",
]

# SGLang's defaults: requests with at most this many cached tokens are checked against the
# other waiting requests...
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
# ...and sorted last when they share at least this many leading tokens with an earlier one.
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32


@component("priority")
class PriorityPolicy:
    """Priority scheduling, as SGLang's ``--enable-priority-scheduling``: higher
    ``Req.priority`` first (lower first with ``low_values_first``, SGLang's
    ``--schedule-low-priority-values-first``), first come first served among equals; a request
    without a priority counts as ``default_priority``; equal priorities go by the time they
    entered the waiting queue. Running requests are not preempted."""

    low_values_first: bool = False
    default_priority: int = 0

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort by priority, then by the time each request entered the queue (SGLang's
        ``wait_queue_entry_time``; a retracted request entered again when it came back)."""
        sign = 1 if self.low_values_first else -1
        default = self.default_priority

        def key(req: Req) -> tuple[int, float]:
            priority = default if req.priority is None else req.priority
            return sign * priority, req.wait_queue_entry_time

        waiting_queue.sort(key=key)


@component("fcfs")
class FCFSPolicy:
    """First come, first served: the queue stays as it is."""

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Leave the queue in arrival order."""


@component("lpm")
class LPMPolicy:
    """Longest prefix match first, with SGLang's in-batch prefix caching.

    Each waiting request's prompt and output so far (all but the last token, which is always
    computed) is matched against ``tree_cache``; the match length is stored in
    ``req.prefix_len`` and the queue is sorted by it, longest first (ties keep their order).

    In-batch prefix caching: when several waiting requests share a prefix that is not cached
    yet, admitting them together computes it several times. So a request whose cached prefix
    is at most ``in_batch_check_threshold`` tokens is also matched against the requests seen
    before it in this pass (SGLang keeps those in a temporary radix tree); if it shares at
    least ``in_batch_deprioritize_threshold`` leading tokens with one of them it is sorted
    after all the others for this pass, so that the first of them is prefilled, its prefix
    cached, and the rest match it at a later pass. Otherwise its tokens join the temporary
    tree. Only whether that in-batch match reaches the threshold matters, and it does exactly
    when the first ``in_batch_deprioritize_threshold`` tokens equal those of a request in the
    tree, so a set of those leading tokens stands in for the tree.

    Matching costs time linear in the queue, so above ``max_queue_for_prefix_match`` waiting
    requests the queue is left in FCFS order, as SGLang does above 128.
    """

    tree_cache: PrefixCache | None = None
    max_queue_for_prefix_match: int = 128
    in_batch_check_threshold: int = IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
    in_batch_deprioritize_threshold: int = IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too)."""
        if args.max_queue_for_prefix_match < 0:
            raise ArgumentError(
                "max_queue_for_prefix_match",
                f"max_queue_for_prefix_match must be >= 0, got {args.max_queue_for_prefix_match}",
            )
        threshold = args.in_batch_check_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ArgumentError(
                "in_batch_check_threshold",
                f"in_batch_check_threshold must be an integer >= 0 (tokens), got {threshold!r}",
            )
        threshold = args.in_batch_deprioritize_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
            raise ArgumentError(
                "in_batch_deprioritize_threshold",
                f"in_batch_deprioritize_threshold must be an integer >= 1 (tokens), got "
                f"{threshold!r}",
            )

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort by cached prefix length, longest first, requests that share an uncached
        prefix with an earlier one last. FCFS above the queue threshold, and over a disabled
        or absent cache, where SGLang falls back to FCFS."""
        cache = self.tree_cache
        if cache is None or cache.disable or len(waiting_queue) > self.max_queue_for_prefix_match:
            return
        deprioritized = match_waiting_prefixes(
            cache,
            waiting_queue,
            self.in_batch_check_threshold,
            self.in_batch_deprioritize_threshold,
        )
        if deprioritized:
            waiting_queue.sort(key=lambda r: math.inf if r in deprioritized else -r.prefix_len)
        else:
            waiting_queue.sort(key=_neg_prefix_len)


def match_waiting_prefixes(
    cache: PrefixCache,
    waiting_queue: list[Req],
    check: int = IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD,
    deprioritize: int = IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD,
    last_nodes: dict[Req, Any] | None = None,
) -> set[Req]:
    """Match every waiting request against ``cache`` (``req.prefix_len``; the node ending the
    match into ``last_nodes`` when given) and return the requests in-batch prefix caching
    holds back (see ``LPMPolicy``): SGLang's ``_compute_prefix_matches``."""
    match_prefix = cache.match_prefix
    # The shared-prefix test covers whole pages (as Dynamo's SGLang model does).
    page = cache.page_size
    head_len = -(-deprioritize // page) * page
    in_batch: set[tuple] = set()  # leading tokens (and namespace) of the temporary tree
    deprioritized: set[Req] = set()
    for req in waiting_queue:
        match = match_prefix(prefix_match_key(req, page))
        req.prefix_len = len(match.device_indices)
        if last_nodes is not None:
            last_nodes[req] = match.last_node
        if req.prefix_len > check or req.seqlen < head_len:
            continue
        origin = req.origin_input_ids
        tokens = origin if len(origin) >= head_len else [*origin, *req.output_ids]
        head = (req.extra_key, req.cache_salt, *tokens[:head_len])
        if head in in_batch:
            deprioritized.add(req)
        else:
            in_batch.add(head)
    return deprioritized


def _neg_prefix_len(req: Req) -> int:
    return -req.prefix_len
