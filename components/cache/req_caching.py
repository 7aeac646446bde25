"""The request caching functions of a cache that inserts through its own ``insert`` and
``match_prefix`` (the sliding-window cache; ``RadixCache`` has faster ones of its own). Mixed
into ``RadixTree``."""

from __future__ import annotations

from schedkit.components.cache.cache_keys import fill_ids_prefix
from schedkit.components.cache.req_locks import unlock_req
from schedkit.core.schedule_batch import Req

__all__ = ["ReqCaching"]


class ReqCaching:
    """SGLang's ``cache_finished_req`` and ``cache_unfinished_req`` over the cache's
    ``insert``, ``match_prefix`` and locks."""

    __slots__ = ()

    def cache_finished_req(self, req: Req) -> None:
        """SGLang's ``cache_finished_req``: hand all of the request's KV to the cache and drop
        the request's hold on it.

        Used for finished, aborted and retracted requests: the tokens with KV are inserted (the
        cache frees slots it already holds for the same tokens, and a trailing partial page), the
        lock on ``req.last_node`` is released and the request is left without KV state.
        """
        kv = req.kv_indices
        if kv:
            self.insert(fill_ids_prefix(req, len(kv)), kv, priority=req.priority)
        unlock_req(self, req)
        req.swa_uuid_for_lock = None
        req.kv_indices = []
        req.prefix_len = 0
        req.last_node = None

    def cache_unfinished_req(self, req: Req) -> None:
        """SGLang's ``cache_unfinished_req``: publish a still-running request's KV in the cache
        so that other requests can match it.

        The whole pages of the tokens with KV are inserted, the request's lock moves to the node
        that now ends its prefix, and ``req.kv_indices`` / ``req.prefix_len`` take the cache's
        slots for that prefix (slots the cache already had replace the request's duplicates). A
        trailing partial page stays with the request.
        """
        if self.disable:
            return
        kv = req.kv_indices
        n = len(kv)
        if getattr(self, "is_eagle", False):
            # EAGLE: bigrams of the tokens with KV (n - 1 of them, as SGLang keys fill_ids); a
            # key of ``aligned`` bigrams is ``aligned + 1`` tokens.
            bigrams = max(0, n - 1)
            aligned = bigrams - bigrams % self.page_size
            key = fill_ids_prefix(req, aligned + 1 if aligned else 0)
        else:
            aligned = n - n % self.page_size
            key = fill_ids_prefix(req, aligned)
        self.insert(key, kv[:aligned], priority=req.priority)
        match = self.match_prefix(key)
        token = self.inc_lock_ref(match.last_node)
        unlock_req(self, req)
        req.swa_uuid_for_lock = token
        req.kv_indices = match.device_indices + kv[aligned:]
        req.prefix_len = len(match.device_indices)
        req.last_node = match.last_node
