"""Moving a request's KV slots into the prefix cache, after SGLang's ``cache_finished_req`` and
``cache_unfinished_req``.

A request holds ``req.kv_indices``: one KV slot per token of ``req.fill_ids`` that has KV, the
cached prefix first. The prefix part is owned by the cache and locked through ``req.last_node``;
the rest is owned by the request. The cache needs ``insert(key, value, priority=)``,
``match_prefix(key)``, ``inc_lock_ref(node) -> token``, ``dec_lock_ref(node, token)``,
``page_size`` and ``disable`` (a ``RadixCache`` or ``SWARadixCache``). The lock token is kept in
``req.swa_uuid_for_lock``. Keys carry the request's namespace (``extra_key``, ``cache_salt``).

The scheduler calls the caches' methods of the same names. The sliding-window cache's are
these functions; ``RadixCache`` has its own, which start at ``req.last_node`` instead of walking
the prefix again and leave the same state (a test compares the two on random workloads).
"""

from __future__ import annotations

from typing import Any

from schedkit.components.cache.tree_node import RadixKey

from schedkit.core.schedule_batch import Req

__all__ = [
    "cache_finished_req",
    "cache_unfinished_req",
    "fill_ids_prefix",
    "fill_ids_slice",
    "prefix_match_key",
    "req_namespace",
]


def fill_ids_prefix(req: Req, n: int) -> list[int]:
    """``req.fill_ids[:n]`` (``n`` may be negative) as a cache key: a plain list built with a
    single copy of the prompt, or a ``RadixKey`` in the request's namespace when it has an
    ``extra_key`` or ``cache_salt``."""
    if n < 0:
        n = max(0, n + len(req.origin_input_ids) + len(req.output_ids))
    key = fill_ids_slice(req, 0, n)
    if req.extra_key is None and req.cache_salt is None:
        return key
    return RadixKey(key, req.extra_key, req.cache_salt)


def prefix_match_key(req: Req, page_size: int) -> list[int]:
    """The key admission matches: the whole pages of ``req.fill_ids[:-1]`` (the last token is
    always computed, and a match covers whole pages only), copying nothing more."""
    n = len(req.origin_input_ids) + len(req.output_ids) - 1
    return fill_ids_prefix(req, max(0, n - n % page_size))


def fill_ids_slice(req: Req, start: int, stop: int) -> list[int]:
    """``req.fill_ids[start:stop]`` for ``0 <= start <= stop``, copying only that part."""
    origin = req.origin_input_ids
    if stop <= len(origin):
        return origin[start:stop]
    if start >= len(origin):
        return req.output_ids[start - len(origin) : stop - len(origin)]
    return origin[start:] + req.output_ids[: stop - len(origin)]


def req_namespace(req: Req) -> tuple[str | None, str | None] | None:
    """The namespace of the request's cache keys (``RadixKey.namespace``)."""
    if req.extra_key is None and req.cache_salt is None:
        return None
    return (req.extra_key, req.cache_salt)


def cache_finished_req(tree_cache: Any, req: Req) -> None:
    """Hand all of the request's KV to the cache and drop the request's hold on it.

    Used for finished, aborted and retracted requests: the tokens with KV are inserted (the
    cache frees slots it already holds for the same tokens, and a trailing partial page), the
    lock on ``req.last_node`` is released and the request is left without KV state.
    """
    kv = req.kv_indices
    if kv:
        tree_cache.insert(fill_ids_prefix(req, len(kv)), kv, priority=req.priority)
    if req.last_node is not None:
        tree_cache.dec_lock_ref(req.last_node, req.swa_uuid_for_lock)
    req.swa_uuid_for_lock = None
    req.kv_indices = []
    req.prefix_len = 0
    req.last_node = None


def cache_unfinished_req(tree_cache: Any, req: Req) -> None:
    """Publish a still-running request's KV in the cache so that other requests can match it.

    The whole pages of the tokens with KV are inserted, the request's lock moves to the node
    that now ends its prefix, and ``req.kv_indices`` / ``req.prefix_len`` take the cache's
    slots for that prefix (slots the cache already had replace the request's duplicates). A
    trailing partial page stays with the request.
    """
    if tree_cache.disable:
        return
    kv = req.kv_indices
    n = len(kv)
    aligned = n - n % tree_cache.page_size
    key = fill_ids_prefix(req, aligned)
    tree_cache.insert(key, kv[:aligned], priority=req.priority)
    match = tree_cache.match_prefix(key)
    token = tree_cache.inc_lock_ref(match.last_node)
    if req.last_node is not None:
        tree_cache.dec_lock_ref(req.last_node, req.swa_uuid_for_lock)
    req.swa_uuid_for_lock = token
    req.kv_indices = match.device_indices + kv[aligned:]
    req.prefix_len = len(match.device_indices)
    req.last_node = match.last_node
