"""A request's prefix-cache keys: slices of ``req.fill_ids`` (prompt then output) copied once,
in the request's namespace (``extra_key``, ``cache_salt``) when it has one. A packed prompt
(``array('I')``) gives packed keys (a namespaced key is a ``RadixKey``, a list)."""

from __future__ import annotations

from array import array

from schedkit.components.cache.tree_node import RadixKey, Tokens
from schedkit.core.schedule_batch import Req

__all__ = [
    "fill_ids_prefix",
    "fill_ids_slice",
    "prefix_match_key",
    "req_namespace",
]


def fill_ids_prefix(req: Req, n: int) -> Tokens:
    """``req.fill_ids[:n]`` (``n`` may be negative) as a cache key: a plain list (packed, an
    ``array('I')``, when the prompt is) built with a single copy of the prompt, or a
    ``RadixKey`` in the request's namespace when it has an ``extra_key`` or ``cache_salt``."""
    if n < 0:
        n = max(0, n + len(req.origin_input_ids) + len(req.output_ids))
    key = fill_ids_slice(req, 0, n)
    if req.extra_key is None and req.cache_salt is None:
        return key
    return RadixKey(key, req.extra_key, req.cache_salt)


def prefix_match_key(req: Req, page_size: int) -> Tokens:
    """The key admission matches: the whole pages of ``req.fill_ids[:-1]`` (the last token is
    always computed, and a match covers whole pages only), copying nothing more."""
    n = len(req.origin_input_ids) + len(req.output_ids) - 1
    return fill_ids_prefix(req, max(0, n - n % page_size))


def fill_ids_slice(req: Req, start: int, stop: int) -> Tokens:
    """``req.fill_ids[start:stop]`` for ``0 <= start <= stop``, copying only that part (packed
    when the prompt is, as far as the output tokens fit 4 bytes)."""
    origin = req.origin_input_ids
    if type(origin) is not list and (type(origin) is not array or origin.typecode != "I"):
        origin = list(origin)  # another kind of sequence: its tokens as a list
    if stop <= len(origin):
        return origin[start:stop]
    if start >= len(origin):
        return req.output_ids[start - len(origin) : stop - len(origin)]
    output = req.output_ids[: stop - len(origin)]
    if type(origin) is list:
        return origin[start:] + output
    try:
        return origin[start:] + array("I", output)
    except OverflowError:  # an output id past 2**32 - 1: a list holds it
        return origin[start:].tolist() + output


def req_namespace(req: Req) -> tuple[str | None, str | None] | None:
    """The namespace of the request's cache keys (``RadixKey.namespace``)."""
    if req.extra_key is None and req.cache_salt is None:
        return None
    return (req.extra_key, req.cache_salt)
