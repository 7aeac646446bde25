"""SGLang's cache-aware scheduling policies besides ``lpm``: ``dfs-weight``, ``hrrn`` and
``shortest-prefill-first`` (``schedule_policy.SchedulePolicy`` in SGLang).

Each matches every waiting request against the prefix cache first (``req.prefix_len``) and runs
in-batch prefix caching (``match_waiting_prefixes``): a request sharing an uncached prefix with
an earlier waiting one is held back for this pass. ``hrrn`` falls back to first come, first
served above ``max_queue_for_prefix_match`` waiting requests (128), as SGLang does for ``lpm``
and ``hrrn``; ``dfs-weight`` and ``shortest-prefill-first`` always sort. Over a disabled cache
SGLang turns ``dfs-weight`` and ``hrrn`` into FCFS and refuses ``shortest-prefill-first``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from schedkit.components.scheduler.schedule_policy import (
    IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD,
    IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD,
    match_waiting_prefixes,
)
from schedkit.core.component import ArgumentError, component
from schedkit.core.protocols import PrefixCache
from schedkit.core.schedule_batch import Req

__all__ = ["DFSWeightPolicy", "HRRNPolicy", "ShortestPrefillFirstPolicy"]


def _zero() -> int:
    return 0


@component("dfs-weight")
class DFSWeightPolicy:
    """Depth-first over the radix tree, heaviest subtree first: each waiting request weighs on
    the node its cached prefix ends at; a node's weight is its requests plus its subtree's;
    children are visited by weight, descending (ties in the tree's order), and a node's own
    requests come after its subtree's (the root's, with nothing cached, last). Requests that
    share a prefix are thereby admitted together while it is cached. ``tree_cache`` must be a
    radix cache (``root``, ``children``, ``parent``)."""

    tree_cache: PrefixCache | None = None

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Order the queue depth-first by subtree weight."""
        cache = self.tree_cache
        if cache is None or cache.disable or not waiting_queue:
            return
        last_nodes: dict[Req, Any] = {}
        match_waiting_prefixes(cache, waiting_queue, last_nodes=last_nodes)
        root = cache.root
        reqs_at: dict[Any, list[Req]] = {}
        for req in waiting_queue:
            reqs_at.setdefault(last_nodes[req] or root, []).append(req)
        weight: dict[Any, int] = {}
        for node, reqs in reqs_at.items():
            while node is not None:
                weight[node] = weight.get(node, 0) + len(reqs)
                node = node.parent
        order: list[Req] = []
        # Iterative post-order over the weighted nodes only: a zero-weight subtree adds nothing.
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.extend(reqs_at.get(node, ()))
                continue
            stack.append((node, True))
            children = [c for c in node.children.values() if c in weight]
            children.sort(key=lambda c: -weight[c])
            stack.extend((c, False) for c in reversed(children))
        waiting_queue[:] = order


@component("hrrn")
class HRRNPolicy:
    """Highest response ratio next, aged in tokens (SGLang's ``hrrn``): a request's ratio grows
    with the prefill tokens the scheduler processed since it arrived over the tokens it still
    has to prefill (``len(origin_input_ids) - prefix_len``); highest first, a request with
    nothing to prefill before all, held-back requests (in-batch prefix caching) last, ties by
    rid. ``processed_tokens`` is the scheduler's counter (``!late
    scheduler.processed_prefill_tokens``); requests carry its value at arrival
    (``Req.arrival_processed_tokens``). Without the counter every ratio is equal (rid order),
    as SGLang's call sites that pass none."""

    tree_cache: PrefixCache | None = None
    processed_tokens: Callable[[], int] = _zero
    max_queue_for_prefix_match: int = 128
    in_batch_check_threshold: int = IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
    in_batch_deprioritize_threshold: int = IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort by response ratio, highest first."""
        cache = self.tree_cache
        if cache is None or cache.disable or len(waiting_queue) > self.max_queue_for_prefix_match:
            return
        held = match_waiting_prefixes(
            cache,
            waiting_queue,
            self.in_batch_check_threshold,
            self.in_batch_deprioritize_threshold,
        )
        processed = self.processed_tokens()

        def key(req: Req) -> tuple[float, str]:
            if req in held:
                return math.inf, req.rid
            uncached = len(req.origin_input_ids) - req.prefix_len
            if uncached <= 0:
                return -math.inf, req.rid
            waited = max(0, processed - req.arrival_processed_tokens)
            return -waited / uncached, req.rid

        waiting_queue.sort(key=key)


@component("shortest-prefill-first")
class ShortestPrefillFirstPolicy:
    """Fewest uncached tokens first (SGLang's experimental ``shortest-prefill-first``): the
    work is ``max(1, prompt + output - prefix_len)``; held-back requests (in-batch prefix
    caching) last; ties by the time a request entered the queue. Needs an enabled prefix
    cache, as in SGLang. (SGLang also caps a chunked prefill to leave room for shorter waiting
    requests; schedkit does not.)"""

    tree_cache: PrefixCache
    in_batch_check_threshold: int = IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
    in_batch_deprioritize_threshold: int = IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too)."""
        if args.tree_cache.disable:
            raise ArgumentError(
                "tree_cache",
                "shortest-prefill-first requires prefix caching (tree_cache.disable)",
            )

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort by uncached prefill work, least first."""
        held = match_waiting_prefixes(
            self.tree_cache,
            waiting_queue,
            self.in_batch_check_threshold,
            self.in_batch_deprioritize_threshold,
        )
        waiting_queue.sort(
            key=lambda r: (r in held, max(1, r.seqlen - r.prefix_len), r.wait_queue_entry_time)
        )
