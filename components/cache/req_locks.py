"""A request's lock on its cached prefix: releasing it whole, or its sliding-window part early
(SGLang's ``dec_swa_lock_only`` once a request decodes past its window)."""

from __future__ import annotations

from typing import Any

from schedkit.core.schedule_batch import Req

__all__ = ["release_swa_prefix_lock", "unlock_req"]


def unlock_req(tree_cache: Any, req: Req) -> None:
    """Release the request's lock on ``req.last_node`` (only its full part when the
    sliding-window part went early, ``release_swa_prefix_lock``)."""
    if req.last_node is not None:
        if req.swa_prefix_lock_released:
            tree_cache.dec_lock_ref(req.last_node, req.swa_uuid_for_lock, skip_swa=True)
        else:
            tree_cache.dec_lock_ref(req.last_node, req.swa_uuid_for_lock)
    req.swa_prefix_lock_released = False


def release_swa_prefix_lock(tree_cache: Any, req: Req) -> None:
    """Release the sliding-window part of the request's prefix lock now, keeping the full
    part (a sliding-window cache's ``dec_swa_lock_only``). Once per lock; a no-op without a
    lock."""
    if req.last_node is None or req.swa_prefix_lock_released:
        return
    tree_cache.dec_swa_lock_only(req.last_node, req.swa_uuid_for_lock)
    req.swa_prefix_lock_released = True
