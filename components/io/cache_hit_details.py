"""A request's prefix-cache hits by tier as its output messages report them, after SGLang's
``get_cached_tokens_details``."""

from __future__ import annotations

from typing import Any

from schedkit.core.schedule_batch import Req

__all__ = ["cached_tokens_details", "details_column"]


def cached_tokens_details(req: Req, storage_enabled: bool, tree_cache: Any) -> dict | None:
    """The request's hits by tier, or None when it had none: ``{"device": d, "host": h}``
    when any tier count is known and positive, plus ``storage`` (and ``storage_backend``, the
    type of ``tree_cache``'s storage backend) with hierarchical-cache storage;
    ``{"device": cached_tokens, "host": 0}`` when only the total is known."""
    device, host, storage = (
        req.cached_tokens_device,
        req.cached_tokens_host,
        req.cached_tokens_storage,
    )
    if device > 0 or host > 0 or storage > 0:
        details: dict[str, int | str] = {"device": device, "host": host}
        # A storage hit can be reported by another node even when this one has no storage.
        if storage > 0 or storage_enabled:
            details["storage"] = storage
        if storage_enabled:
            details["storage_backend"] = _storage_backend_type(tree_cache)
        return details
    if req.cached_tokens > 0:
        return {"device": req.cached_tokens, "host": 0}
    return None


def details_column(reqs: list[Req], storage_enabled: bool, tree_cache: Any) -> list[dict | None]:
    """``cached_tokens_details`` of each request for one value of the storage flag."""
    details: list[dict | None] = []
    for req in reqs:
        device, host, storage = (
            req.cached_tokens_device,
            req.cached_tokens_host,
            req.cached_tokens_storage,
        )
        if storage_enabled or storage > 0:
            details.append(cached_tokens_details(req, storage_enabled, tree_cache))
        elif device > 0 or host > 0:
            details.append({"device": device, "host": host})
        elif req.cached_tokens > 0:
            details.append({"device": req.cached_tokens, "host": 0})
        else:
            details.append(None)
    return details


def _storage_backend_type(tree_cache: Any) -> str:
    controller = getattr(tree_cache, "cache_controller", None)
    backend = getattr(controller, "storage_backend", None)
    return "none" if backend is None else type(backend).__name__
