"""``kv``: the SGLang model gateway's cache-aware rule (``schedkit.router.cache_aware``) over
what the workers report in their KV events plus the prompts routed to them and not yet
prefilled (``PendingPrompts``).

The gateway's own tree (``sglang``) records a prompt on the chosen worker when it routes it;
an index fed only by KV events learns of it after the worker has computed it, and forgets it
when the worker evicts. Overlaying the routed-but-not-prefilled prompts closes that gap, so
neither a burst of requests sharing a prefix nor the ``smallest_cache`` fallback (the worker
that just evicted has the fewest pages) can send everything to one worker. Thresholds are
the gateway's command-line ones (0.3 / 64 / 1.5, on requests in flight). One default differs
from the gateway: a request below the cache threshold goes to the worker with the fewest
prompt tokens queued for prefill (``fallback="least_prefill"``), not the fewest requests in
flight (``fallback="least_loaded"``, the gateway's): requests in flight are mostly decoding,
so balancing them evens out decode occupancy, not the prefill work a new prompt waits
behind (on the no-sharing Azure-shaped trace the gateway's choice raised TTFT p50 above
round robin's; see docs/router.md); and equally loaded workers go to the one sent the fewest
requests so far (``tie_break="fewest_routed"``). Ties on the longest prefix go to the least
loaded holder, then the lowest rank. Signals: requests in flight, prefill tokens, the KV-event
prefix and the pending prompts.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from schedkit.router.base import Candidates, register_policy
from schedkit.router.cache_aware import FALLBACKS, TIE_BREAKS, CacheAwareRule, _in

__all__ = ["KvCacheAware"]


@register_policy
@attrs.define(kw_only=True)
class KvCacheAware(CacheAwareRule):
    """The cache-aware rule over the KV-event index and the pending prompts; a miss goes to
    the worker with the least prefill queued (``fallback="least_prefill"``)."""

    fallback: str = attrs.field(default="least_prefill", validator=_in(FALLBACKS))
    tie_break: str = attrs.field(default="fewest_routed", validator=_in(TIE_BREAKS))

    name: ClassVar[str] = "kv"
    signals: ClassVar[tuple[str, ...]] = (
        "requests",
        "prefill_tokens",
        "prefix",
        "pending_prefix",
    )
    uses_prefix: ClassVar[bool] = True
    uses_pending: ClassVar[bool] = True

    @property
    def reads_cached_pages(self) -> bool:
        """Whether ``choose`` reads ``Candidates.cached_pages`` (the ``smallest_cache``
        fallback only)."""
        return self.fallback == "smallest_cache"

    def choose(self, c: Candidates) -> tuple[int, str]:
        """The rule, the longest match (index + pending) deciding the prefix step."""
        matched = c.matched
        best = max(matched.values(), default=0)
        loads = self.loads(c)
        holders = [r for r in c.ranks if matched.get(r, 0) == best]
        holder = min(holders, key=loads.__getitem__) if best else -1
        smallest = self.fallback == "smallest_cache"
        cached = {r: c.cached_pages(r) for r in c.ranks} if smallest else None
        return self.decide(c, best, holder, cached)
