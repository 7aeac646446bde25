"""Routing requests over a fleet of schedulers (data-parallel ranks).

A ``Router`` asks a routing policy where each request goes; policies are registered by name
(``POLICIES``; ``register_policy`` adds one, ``make_policy(name, **settings)`` builds one) and
read the load signals of ``LoadBoard`` and, for prefix-aware ones, a ``KvIndex`` fed with the
ranks' KV events. ``KvRouter`` follows the ranks' KV-event streams over ZeroMQ itself. The
policies, one module each, and their sources are in ``docs/router.md``:

- ``sglang``: the SGLang model gateway's cache-aware policy with its own approximate tree;
- ``kv``: the same rule over the KV-event index plus the prompts not yet prefilled;
- ``dynamo``: NVIDIA Dynamo's KV router cost with softmax selection;
- ``llm-d``: llm-d's prefix-cache, queue and KV-utilisation scorers, max-score picker;
- ``power_of_two``, ``session``, ``round_robin``, ``least_loaded``, ``longest_prefix``.
"""

from schedkit.router import dynamo, kv, llm_d, power_of_two, session, sglang, simple
from schedkit.router.base import (
    POLICIES,
    SIGNALS,
    Candidates,
    Route,
    RoutingPolicy,
    make_policy,
    policy_settings,
    register_policy,
)
from schedkit.router.cache_aware import CacheAwareRule
from schedkit.router.dynamo import DynamoKvCost
from schedkit.router.kv import KvCacheAware
from schedkit.router.kv_router import KvRouter, batches_after_break, rank_endpoints
from schedkit.router.llm_d import LlmdScorers
from schedkit.router.load import LoadBoard, WorkerLoad
from schedkit.router.power_of_two import PowerOfTwo
from schedkit.router.router import Router
from schedkit.router.session import SessionAffinity
from schedkit.router.sglang import SglangCacheAware
from schedkit.router.simple import LeastLoaded, LongestPrefix, RoundRobin

__all__ = [
    "POLICIES",
    "SIGNALS",
    "CacheAware",
    "CacheAwareRule",
    "Candidates",
    "DynamoKvCost",
    "KvCacheAware",
    "KvRouter",
    "LeastLoaded",
    "LlmdScorers",
    "LoadBoard",
    "LongestPrefix",
    "PowerOfTwo",
    "RoundRobin",
    "Route",
    "Router",
    "RoutingPolicy",
    "SessionAffinity",
    "SglangCacheAware",
    "WorkerLoad",
    "batches_after_break",
    "make_policy",
    "policy_settings",
    "rank_endpoints",
    "register_policy",
]

CacheAware = KvCacheAware  # the name the ``kv`` policy had
del dynamo, kv, llm_d, power_of_two, session, sglang, simple
