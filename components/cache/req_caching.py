"""SGLang's request caching functions (``cache_finished_req``, ``cache_unfinished_req``):
``ReqCaching`` through a cache's own ``insert`` and ``match_prefix`` (the sliding-window cache;
mixed into ``RadixTree``), ``RadixReqCaching`` inserting from the request's locked prefix node
(``RadixCache`` and the host-tier cache)."""

from __future__ import annotations

from itertools import chain

from schedkit.components.cache.cache_keys import fill_ids_prefix, fill_ids_slice, req_namespace
from schedkit.components.cache.req_locks import unlock_req
from schedkit.components.cache.tree_node import TreeNode
from schedkit.core.schedule_batch import Req

__all__ = ["RadixReqCaching", "ReqCaching"]


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


class RadixReqCaching:
    """The request caching functions of ``RadixCache``: the insert starts at the request's
    locked prefix node, so the prefix is not walked again. Uses the cache's ``_insert_below``,
    ``_free``, locks and ``_tick``."""

    __slots__ = ()

    def cache_finished_req(self, req: Req) -> None:
        """SGLang's ``cache_finished_req``: insert the request's KV and release its lock, as
        ``ReqCaching.cache_finished_req`` does. The insert starts at the request's locked prefix
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
        lock to the node that ends them, as ``ReqCaching.cache_unfinished_req`` does. The insert
        starts at the
        request's locked prefix node, and the match that follows in SGLang is the path the
        insert walked."""
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

    def _touch_path(self, node: TreeNode | None, priority: int, hit: bool) -> TreeNode:
        """Mark the path from the root to ``node`` (None: the root) as just used, root first,
        as a walk from the root would; returns ``node`` or the root."""
        if node is None:
            return self.root
        path, walk, root = [], node, self.root
        while walk is not root:
            path.append(walk)
            walk = walk.parent
        tick = self._tick
        for walk in reversed(path):
            walk.last_access_time = tick()
            walk.hit_count += hit
            if priority > walk.priority:
                walk.priority = priority
        return node
