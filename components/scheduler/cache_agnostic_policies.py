"""SGLang's cache-agnostic scheduling policies besides ``fcfs``: ``lof``, ``random`` and
``routing-key`` (``schedule_policy.SchedulePolicy`` in SGLang)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import attrs

from schedkit.core.component import component
from schedkit.core.schedule_batch import Req, ScheduleBatch

__all__ = ["LongestOutputFirstPolicy", "RandomPolicy", "RoutingKeyPolicy"]


@component("lof")
class LongestOutputFirstPolicy:
    """Longest output first: the largest ``max_new_tokens`` first (a stable sort: queue order
    among equals). With ``enable_priority_scheduling`` requests are sorted by priority first
    (higher first, lower with ``low_values_first``; a request without one counts as
    ``default_priority``), as SGLang's ``lof`` under ``--enable-priority-scheduling``."""

    enable_priority_scheduling: bool = False
    low_values_first: bool = False
    default_priority: int = 0

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort by ``max_new_tokens``, largest first (by priority first when enabled)."""
        if not self.enable_priority_scheduling:
            waiting_queue.sort(key=lambda r: -r.sampling_params.max_new_tokens)
            return
        sign = 1 if self.low_values_first else -1
        default = self.default_priority
        waiting_queue.sort(
            key=lambda r: (
                sign * (default if r.priority is None else r.priority),
                -r.sampling_params.max_new_tokens,
            )
        )


@component("random")
class RandomPolicy:
    """A random order, drawn afresh at every pass (SGLang shuffles with the process-wide
    ``random``; here a generator of its own, seeded by ``seed`` for repeatable runs, or from
    the operating system when None)."""

    seed: int | None = 0
    _rng: random.Random = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Shuffle the queue."""
        self._rng.shuffle(waiting_queue)


def _no_batch() -> ScheduleBatch | None:
    return None


@component("routing-key")
class RoutingKeyPolicy:
    """Requests whose ``routing_key`` is most common in the running batch first (grouping a
    key's requests so they run together); among keys the running batch shares, more running
    first, then by key; requests of other keys or none after them, by key (no key first). The
    queue is left as it is while no running request has a key. ``running_batch`` is the
    scheduler's (``!late scheduler.running_batch``)."""

    running_batch: Callable[[], ScheduleBatch | None] = _no_batch

    def calc_priority(self, waiting_queue: list[Req]) -> None:
        """Sort by the running batch's routing-key counts."""
        batch = self.running_batch()
        if batch is None:
            return
        counts = Counter(r.routing_key for r in batch.reqs if r.routing_key)
        if not counts:
            return

        def key(req: Req) -> tuple[int, int, str]:
            routing_key = req.routing_key
            if routing_key and routing_key in counts:
                return 0, -counts[routing_key], routing_key
            return 1, 0, routing_key or ""

        waiting_queue.sort(key=key)
