"""SGLang's parameter and result objects for its prefix caches (``base_prefix_cache`` and
``cache_init_params`` in ``sglang.srt.mem_cache``), with SGLang's field names and defaults.

The caches take them alongside their own calls: ``match_prefix(MatchPrefixParams(key=...))``
returns the ``MatchResult`` ``match_prefix(key)`` does, ``insert(InsertParams(...))`` returns an
``InsertResult`` where ``insert(key, value)`` returns the prefix length, ``evict(EvictParams(...))``
an ``EvictResult`` where ``evict(n)`` returns the tokens evicted. Only the fields the caches
act on are declared: SGLang's Mamba, hybrid-model and sub-context fields are absent, so passing
one is a ``TypeError`` naming it rather than a setting silently ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

__all__ = [
    "CacheInitParams",
    "EvictParams",
    "EvictResult",
    "InsertParams",
    "InsertResult",
    "MatchPrefixParams",
]


@attrs.define(slots=True)
class MatchPrefixParams:
    """What ``match_prefix`` looks up: ``key`` (a ``RadixKey`` or token ids). ``req``, the
    request matching (SGLang's Mamba cache reads it), is carried and not used."""

    key: Sequence[int]
    req: Any = None


@attrs.define(slots=True)
class InsertParams:
    """What ``insert`` stores: ``key`` with one KV slot per token in ``value`` (a list of ints
    or anything with ``tolist()``, e.g. a tensor; None: the cache takes slots for the new
    part), raising the eviction ``priority`` of the nodes on its path."""

    key: Sequence[int] | None = None
    value: Any = None
    priority: int = 0


@attrs.define(slots=True)
class InsertResult:
    """How many leading tokens of an insert's key the cache held already."""

    prefix_len: int


@attrs.define(slots=True)
class EvictParams:
    """How much ``evict`` frees: ``num_tokens`` full-attention tokens and (sliding-window
    cache) ``swa_num_tokens`` sliding-window tokens. A cache without sliding-window KV has
    none to free and evicts none of it."""

    num_tokens: int = 0
    swa_num_tokens: int = 0


@attrs.define(slots=True)
class EvictResult:
    """What ``evict`` freed: full-attention and sliding-window tokens."""

    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0


@attrs.define(slots=True)
class CacheInitParams:
    """SGLang's construction parameters of a prefix cache, in its order: ``RadixCache(params)``.

    ``token_to_kv_pool_allocator`` None makes a cache without a KV pool (``SimulatedSlots``, as
    ``create_simulated``). ``req_to_token_pool`` is accepted and not used: a request here
    carries its own KV slots (``Req.kv_indices``). ``sliding_window_size`` is read by the
    sliding-window cache and, as in SGLang, ignored by the others; ``is_eagle`` is supported
    by the sliding-window cache only.
    """

    disable: bool
    req_to_token_pool: Any
    token_to_kv_pool_allocator: Any
    page_size: int
    is_eagle: bool = False
    eviction_policy: str = "lru"
    enable_kv_cache_events: bool = False
    sliding_window_size: int | None = None
