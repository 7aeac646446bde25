"""The SGLang model gateway's cache-aware rule (``sgl-model-gateway/src/policies/
cache_aware.rs``, ``CacheAwarePolicy::select_worker``), shared by the ``sglang`` and ``kv``
policies, which differ only in where the prefix match comes from.

1. Imbalanced (both strict): ``max - min > balance_abs_threshold`` and
   ``max > min * balance_rel_threshold`` over the workers' loads: the least loaded worker.
2. Otherwise, the match rate of the longest prefix (matched tokens / prompt tokens): above
   ``cache_threshold``, the worker holding that prefix; else the fallback: the least loaded
   worker (``fallback="least_loaded"``, what the gateway does today) or the worker whose cache
   holds the fewest pages (``"smallest_cache"``, the gateway's rule before, ``get_smallest_
   tenant``).

Load is the gateway's ``worker.load()``: requests routed and not finished
(``load="requests"``), or the tokens in flight (``"tokens"``: prefill still to compute plus
decode context), a setting of ours. Among equally loaded workers the first in rank order
wins (``tie_break="first"``: the gateway's ``min_by_key`` over its worker list keeps the
first), or the one sent the fewest requests so far, then the lowest rank
(``"fewest_routed"``, a setting of ours, as vllm-project/router changed it: at light load
``min_by_key`` sends each cache miss to the first idle worker).
"""

from __future__ import annotations

import attrs

from schedkit.router.base import Candidates

__all__ = ["FALLBACKS", "LOADS", "TIE_BREAKS", "CacheAwareRule"]

FALLBACKS = ("least_loaded", "least_prefill", "smallest_cache")
LOADS = ("requests", "prefill_tokens", "tokens")
TIE_BREAKS = ("first", "fewest_routed")


def _in(options: tuple[str, ...]):  # an attrs validator naming the valid values
    def check(_instance: object, attribute: attrs.Attribute, value: str) -> None:
        if value not in options:
            raise ValueError(f"{attribute.name} must be one of {', '.join(options)}, got {value!r}")

    return check


@attrs.define(kw_only=True)
class CacheAwareRule:
    """The thresholds and the decision (see the module docstring); defaults are the gateway's
    command-line defaults (``sgl-model-gateway/src/main.rs``); its library
    ``CacheAwareConfig::default()`` has 0.5 / 32 / 1.1."""

    cache_threshold: float = attrs.field(
        default=0.3, validator=[attrs.validators.ge(0), attrs.validators.le(1)]
    )
    balance_abs_threshold: int = attrs.field(default=64, validator=attrs.validators.ge(0))
    balance_rel_threshold: float = attrs.field(default=1.5, validator=attrs.validators.ge(0))
    fallback: str = attrs.field(default="least_loaded", validator=_in(FALLBACKS))
    load: str = attrs.field(default="requests", validator=_in(LOADS))
    tie_break: str = attrs.field(default="first", validator=_in(TIE_BREAKS))

    def loads(self, c: Candidates) -> dict[int, int]:
        """Each live rank's load under the ``load`` setting."""
        workers = c.loads.workers
        if self.load == "prefill_tokens":
            return {r: workers[r].prefill_tokens for r in c.ranks}
        if self.load == "tokens":
            return {r: workers[r].tokens for r in c.ranks}
        return {r: workers[r].requests for r in c.ranks}

    def decide(
        self,
        c: Candidates,
        matched_pages: int,
        holder: int,
        cached_pages: dict[int, int] | None = None,
    ) -> tuple[int, str]:
        """The rank for a request whose longest match is ``matched_pages`` pages on
        ``holder``; ``cached_pages`` (per rank) is read by the ``smallest_cache`` fallback."""
        loads = self.loads(c)
        workers = c.loads.workers
        if self.tie_break == "first":
            routed = dict.fromkeys(c.ranks, 0)
        else:
            routed = {r: workers[r].routed for r in c.ranks}
        least = min(c.ranks, key=lambda r: (loads[r], routed[r]))
        high, low = max(loads.values()), loads[least]
        if high - low > self.balance_abs_threshold and high > low * self.balance_rel_threshold:
            return least, "imbalanced"
        prompt = c.prompt_tokens
        rate = min(matched_pages * c.page_size, prompt) / prompt if prompt else 0.0
        if rate > self.cache_threshold and holder in loads:
            return holder, "prefix"
        if self.fallback == "smallest_cache" and cached_pages is not None:
            pick = min(c.ranks, key=lambda r: (cached_pages[r], loads[r], routed[r]))
            return pick, "smallest_cache"
        if self.fallback == "least_prefill":
            pick = min(c.ranks, key=lambda r: (workers[r].prefill_tokens, loads[r], routed[r]))
            return pick, "least_prefill"
        return least, "least_loaded"
