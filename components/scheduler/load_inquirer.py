"""The load inquirer: how busy the scheduler is, for load balancing and the ``get_loads`` request.

Everything the host reassigns at run time (running batch, waiting queue, chunked request) and
the metrics reporter's stats arrive as late-bound getters. The waiting queue is a
``WaitingQueue``, which keeps its token totals as requests come and go: a snapshot costs the
same with ten waiting requests or fifty thousand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from schedkit.components.scheduler.waiting_queue import WaitingQueue
from schedkit.core.component import component
from schedkit.core.parallel_state import ParallelState
from schedkit.core.protocols import KVAllocator, PrefixCache
from schedkit.core.schedule_batch import Req, ScheduleBatch

__all__ = ["LOAD_SECTIONS", "LoadInquirer"]

LOAD_SECTIONS = ("core", "memory", "speculative", "queues", "all")


@component("load_inquirer", frozen=True)
class LoadInquirer:
    """Reports running and waiting requests, KV-pool usage and throughput.

    ``num_used_tokens = allocator.size - allocator.available_size() - tree_cache.evictable_size()``
    (SGLang's formula: slots held by requests or locked in the cache; evictable cache entries
    count as free) and ``token_usage = num_used_tokens / allocator.size``.
    """

    allocator: KVAllocator
    tree_cache: PrefixCache
    parallel_state: ParallelState
    get_running_batch: Callable[[], ScheduleBatch]
    get_waiting_queue: Callable[[], WaitingQueue]
    get_stats: Callable[[], Any]
    get_chunked_req: Callable[[], Req | None]

    def num_used_tokens(self) -> int:
        """KV slots in use, not counting what the cache could evict."""
        allocator = self.allocator
        return allocator.size - allocator.available_size() - self.tree_cache.evictable_size()

    def get_loads(self, include: str | Iterable[str] = ("core",)) -> dict[str, Any]:
        """The load snapshot: core fields always, plus the sections named in ``include``.

        Core: ``num_running_reqs``, ``num_waiting_reqs``, ``num_used_tokens``, ``token_usage``,
        ``num_total_tokens`` (used + waiting tokens), ``num_waiting_uncached_tokens``,
        ``gen_throughput``, ``cache_hit_rate``, ``dp_rank``. Sections: ``memory`` (KV-pool
        capacity and its split), ``speculative`` (None: schedkit does no speculative decoding),
        ``queues`` (waiting, chunked and retracted counts); ``all`` adds every section.
        """
        sections = _sections(include)
        waiting = self.get_waiting_queue()
        stats = self.get_stats()
        capacity = self.allocator.size
        used = self.num_used_tokens()
        loads: dict[str, Any] = {
            "num_running_reqs": len(self.get_running_batch().reqs),
            "num_waiting_reqs": len(waiting),
            "num_used_tokens": used,
            "token_usage": round(used / capacity, 4) if capacity else 0.0,
            "num_total_tokens": used + waiting.num_tokens,
            "num_waiting_uncached_tokens": self.num_waiting_uncached_tokens(),
            "gen_throughput": round(stats.gen_throughput, 2),
            "cache_hit_rate": round(stats.cache_hit_rate, 4),
            "dp_rank": self.parallel_state.dp_rank or 0,
        }
        if "memory" in sections:
            loads["memory"] = {
                "token_capacity": capacity,
                "available_tokens": self.allocator.available_size(),
                "evictable_tokens": self.tree_cache.evictable_size(),
                "protected_tokens": self.tree_cache.protected_size(),
            }
        if "speculative" in sections:
            loads["speculative"] = None
        if "queues" in sections:
            loads["queues"] = {
                "waiting": len(waiting),
                "chunked": int(self.get_chunked_req() is not None),
                "retracted": waiting.num_retracted,
            }
        return loads

    def num_pending_tokens(self, chunk_deduct: int = 0) -> int:
        """Tokens waiting for prefill: every waiting request's length plus what the chunked
        request has left (less ``chunk_deduct``, the chunk already planned this step)."""
        pending = self.get_waiting_queue().num_tokens
        chunked = self.get_chunked_req()
        if chunked is not None:
            pending += chunked.seqlen - len(chunked.kv_indices) - chunk_deduct
        return pending

    def num_waiting_uncached_tokens(self) -> int:
        """Tokens waiting for prefill that the prefix cache does not already hold."""
        uncached = self.get_waiting_queue().num_uncached_tokens
        chunked = self.get_chunked_req()
        if chunked is not None:
            uncached += max(0, chunked.seqlen - len(chunked.kv_indices))
        return uncached


def _sections(include: str | Iterable[str]) -> set[str]:
    names = {include} if isinstance(include, str) else set(include)
    unknown = names.difference(LOAD_SECTIONS)
    if unknown:
        raise ValueError(
            f"unknown load section(s) {', '.join(sorted(map(repr, unknown)))}; "
            f"valid sections: {', '.join(LOAD_SECTIONS)}"
        )
    return set(LOAD_SECTIONS) if "all" in names else names
