"""A bound on the modelled time of one prefill step (off unless the scheduler is given
``max_prefill_step_seconds`` and ``prefill_seconds``; SGLang and vLLM bound a step by tokens
only).

The scheduler, as SGLang's, never interrupts a step, so a request that arrives while a long
prefill chunk runs waits for all of it. A token bound alone (``chunked_prefill_size``) cannot
keep that wait short at every depth: a chunk's attention grows with the prefix it attends to,
so a chunk that costs 12 ms at the start of a prompt costs twice that at 32k tokens. Here the
fresh tokens a prefill batch may take are the most, in whole pages, whose prefill costs at most
``max_prefill_step_seconds`` by the model runner's ``prefill_seconds(tokens, prefix)``, taken
at the deepest prefix in the batch (an upper bound on the batch's cost); always one page at
least. ``chunked_prefill_size`` and ``max_prefill_tokens`` still apply.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

__all__ = ["PrefillStepBound"]


@attrs.define(slots=True, kw_only=True)
class PrefillStepBound:
    """Fresh prefill tokens within a step's time budget, by prefix depth (see the module)."""

    max_seconds: float
    prefill_seconds: Callable[[int, int], float]
    page_size: int
    max_tokens: int
    # Tokens allowed, by prefix depth in pages: at most one entry per page of the deepest
    # prefix seen (the context), each found once.
    _by_depth: dict[int, int] = attrs.field(init=False, factory=dict)

    def tokens_at(self, prefix: int) -> int:
        """The most fresh tokens (whole pages, at least one, at most ``max_tokens``) whose
        prefill after ``prefix`` tokens costs at most ``max_seconds``."""
        page = self.page_size
        depth = -(-prefix // page)  # rounded up: the bound holds for any prefix in the page
        tokens = self._by_depth.get(depth)
        if tokens is None:
            tokens = self._by_depth[depth] = self._solve(depth * page)
        return tokens

    def _solve(self, prefix: int) -> int:
        page, cost, limit = self.page_size, self.prefill_seconds, self.max_seconds
        low, high = 1, max(self.max_tokens // page, 1)  # in pages; low always allowed
        while low < high:
            mid = (low + high + 1) // 2
            if cost(mid * page, prefix) <= limit:
                low = mid
            else:
                high = mid - 1
        return low * page
