"""The radix cache's request caching: a request's KV goes in from the node its prefix is locked
on, so the prefix is not walked again (mixed into ``RadixCache``; the generic versions over
``insert`` are ``req_caching.ReqCaching``)."""

from __future__ import annotations

from itertools import chain

from schedkit.components.cache.cache_keys import fill_ids_slice, req_namespace
from schedkit.components.cache.req_caching import ReqCaching
from schedkit.core.schedule_batch import Req

__all__ = ["RadixReqCaching"]


class RadixReqCaching:
    """SGLang's ``cache_finished_req`` and ``cache_unfinished_req`` over ``RadixCache``'s
    ``_insert_below``, ``_free`` and locks."""

    __slots__ = ()

    def cache_finished_req(self, req: Req) -> None:
        """SGLang's ``cache_finished_req``: insert the request's KV and release its lock, as
        ``RadixTree.cache_finished_req`` does. The insert starts at the request's locked prefix
        node: the prefix is the path to that node, so it is not walked again."""
        if self.disable:
            ReqCaching.cache_finished_req(self, req)
            return
        kv, start, priority = req.kv_indices, req.prefix_len, req.priority or 0
        node = self._touch_path(req.last_node, priority, hit=False)
        new = max(0, len(kv) - start)
        end = start + new - new % self.page_size  # whole pages go in, the rest is freed
        duplicates: list[int] = []
        if end > start:
            key, value = fill_ids_slice(req, start, end), kv[start:end]
            namespace = req_namespace(req)
            duplicates = self._insert_below(
                node, key, len(key), value, priority, namespace, owned=True
            )[2]
        self._free(kv[end:], duplicates)
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        req.swa_uuid_for_lock = None
        req.kv_indices = []
        req.prefix_len = 0
        req.last_node = None

    def cache_unfinished_req(self, req: Req) -> None:
        """SGLang's ``cache_unfinished_req``: insert the request's whole pages and move its
        lock to the node that ends them, as ``RadixTree.cache_unfinished_req`` does. The insert
        starts at the request's locked prefix node, and the match that follows in SGLang is the
        path the insert walked."""
        if self.disable:
            return
        kv, start, priority = req.kv_indices, req.prefix_len, req.priority or 0
        aligned = len(kv) - len(kv) % self.page_size
        node = req.last_node if req.last_node is not None else self.root
        key = fill_ids_slice(req, start, aligned)
        last, _, duplicates = self._insert_below(
            node, key, len(key), kv[start:aligned], priority, req_namespace(req), owned=True
        )
        self._free([], duplicates)
        self._touch_path(last, priority, hit=True)
        token = self._lock(last)
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        if duplicates:
            # Pages cached by another request meanwhile: use the cache's slots for them.
            values, walk = [], last
            while walk is not node:
                values.append(walk.value)
                walk = walk.parent
            cached = list(chain.from_iterable(reversed(values)))
            req.kv_indices = kv[:start] + cached + kv[aligned:]
        req.prefix_len = aligned
        req.last_node = last
        req.swa_uuid_for_lock = token
