"""Looking into a radix cache as SGLang's tests and users do: ``pretty_print``,
``all_values_flatten``, ``available_and_evictable_str`` and ``sanity_check`` (the caches'
methods of those names call these)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

__all__ = [
    "all_values_flatten",
    "available_and_evictable_str",
    "device_values_flatten",
    "hicache_sanity_check",
    "pretty_print",
    "sanity_check",
    "swa_available_and_evictable_str",
    "swa_sanity_check",
]


def _preorder(root: Any) -> list[Any]:
    """Every node below ``root``, each before its children, children in insertion order."""
    nodes, stack = [], list(reversed(root.children.values()))
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(reversed(node.children.values()))
    return nodes


def pretty_print(cache: Any, file: TextIO | None = None) -> None:
    """Print the tree as SGLang's ``pretty_print`` does: a line per node, indented two spaces
    per level (key length, first 10 tokens, ``r=`` lock count; a sliding-window node adds
    ``sr=`` and ``ts=`` for its window lock and tombstone), then ``#tokens: N``."""
    out = file if file is not None else sys.stdout
    stack = [(cache.root, 0)]
    while stack:
        node, indent = stack.pop()
        fields = [str(len(node.key)), str(list(node.key[:10])), f"r={node.lock_ref}"]
        if hasattr(node, "swa_lock_ref"):
            fields += [f"sr={node.swa_lock_ref}", f"ts={node.swa_value is None}"]
        print(" " * indent, *fields, file=out)
        for child in node.children.values():  # popped last first, as SGLang's stack walk
            stack.append((child, indent + 2))
    print(f"#tokens: {cache.total_size()}", file=out)


def all_values_flatten(cache: Any) -> list[int]:
    """Every cached KV slot, node by node depth-first (each node before its children)."""
    values: list[int] = []
    for node in _preorder(cache.root):
        values += node.value
    return values


def available_and_evictable_str(cache: Any) -> str:
    """SGLang's ``available_and_evictable_str``: free plus evictable slots."""
    available_size = cache.allocator.available_size()
    evictable_size = cache.evictable_size()
    return (
        f"Available tokens: {available_size + evictable_size} "
        f"({available_size=} + {evictable_size=})\n"
    )


def swa_available_and_evictable_str(cache: Any) -> str:
    """SGLang's sliding-window version: both pools, and the evictable sizes recounted from
    the tree (what SGLang reads from its LRU lists)."""
    full_available_size = cache.allocator.available_size()
    swa_available_size = cache.swa_allocator.available_size()
    full_evictable_size = cache.full_evictable_size()
    swa_evictable_size = cache.swa_evictable_size()
    full_recount, swa_recount = _swa_recount(cache)[:2]
    return (
        f"Available full tokens: {full_available_size + full_evictable_size} "
        f"({full_available_size=} + {full_evictable_size=})\n"
        f"Available swa tokens: {swa_available_size + swa_evictable_size} "
        f"({swa_available_size=} + {swa_evictable_size=})\n"
        f"Full LRU list evictable size: {full_recount}\n"
        f"SWA LRU list evictable size: {swa_recount}\n"
    )


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def sanity_check(cache: Any) -> None:
    """Check the tree against the cache's bookkeeping; AssertionError naming the first
    inconsistency. Locks are counted along paths (a node's lock count is at least the sum of
    its children's), sizes recounted, child keys recomputed, parents linked."""
    evictable = protected = 0
    nodes = _preorder(cache.root)
    for node in nodes:
        size = len(node.key)
        _check(node.value is not None and len(node.value) == size, f"{node!r}: value/key sizes")
        _check(node.parent.children.get(node.ckey) is node, f"{node!r}: not its parent's child")
        _check(node.lock_ref >= 0, f"{node!r}: negative lock_ref {node.lock_ref}")
        children_locks = sum(c.lock_ref for c in node.children.values())
        _check(node.lock_ref >= children_locks, f"{node!r}: lock_ref below its children's")
        if node.lock_ref:
            protected += size
        else:
            evictable += size
        if node.hashes is not None:
            _check(len(node.hashes) * cache.page_size == size, f"{node!r}: hashes per page")
    _check(
        evictable == cache.evictable_size(),
        f"evictable size {cache.evictable_size()} but unlocked nodes hold {evictable}",
    )
    _check(
        protected == cache.protected_size(),
        f"protected size {cache.protected_size()} but locked nodes hold {protected}",
    )


def _swa_recount(cache: Any) -> tuple[int, int, int]:
    """Full evictable, sliding-window evictable and sliding-window protected tokens."""
    full = swa = swa_locked = 0
    for node in _preorder(cache.root):
        if not node.lock_ref:
            full += len(node.key)
        if node.swa_value is not None:
            if node.swa_lock_ref:
                swa_locked += len(node.key)
            else:
                swa += len(node.key)
    return full, swa, swa_locked


def swa_sanity_check(cache: Any) -> None:
    """``sanity_check`` plus the sliding-window rules: a window lock implies a full lock and
    live sliding-window KV, and the sliding-window sizes match the tree."""
    sanity_check(cache)
    for node in _preorder(cache.root):
        tombstone = node.swa_value is None
        _check(node.swa_lock_ref >= 0, f"{node!r}: negative swa_lock_ref")
        _check(node.swa_lock_ref <= node.lock_ref, f"{node!r}: window lock without a full lock")
        _check(not (tombstone and node.swa_lock_ref), f"{node!r}: a locked tombstone")
        if not tombstone:
            _check(len(node.swa_value) == len(node.key), f"{node!r}: swa_value/key sizes")
    _, swa, swa_locked = _swa_recount(cache)
    _check(
        swa == cache.swa_evictable_size(),
        f"swa evictable size {cache.swa_evictable_size()} but the tree holds {swa}",
    )
    _check(
        swa_locked == cache.swa_protected_size(),
        f"swa protected size {cache.swa_protected_size()} but the tree holds {swa_locked}",
    )


def hicache_sanity_check(cache: Any) -> None:
    """A host-tier cache's ``sanity_check``: AssertionError naming the first mismatch of the
    device sizes with the cache's counters, of a host copy with its key, or a device node below
    a host-only one."""
    device = protected = 0
    stack = list(cache.root.children.values())
    while stack:
        node = stack.pop()
        size = len(node.key)
        if node.host_value is not None and len(node.host_value) != size:
            raise AssertionError(f"{node!r}: host_value/key sizes")
        if node.value is None:
            if node.host_value is None:
                raise AssertionError(f"{node!r}: in the tree with neither device nor host KV")
            if node.lock_ref:
                raise AssertionError(f"{node!r}: host-only but locked")
            for child in node.children.values():
                if child.value is not None:
                    raise AssertionError(f"{child!r}: on the device below a host-only node")
        else:
            if len(node.value) != size:
                raise AssertionError(f"{node!r}: value/key sizes")
            device += size
            protected += size if node.lock_ref else 0
        stack.extend(node.children.values())
    if (device - protected, protected) != (cache.evictable_size(), cache.protected_size()):
        raise AssertionError(
            f"evictable / protected sizes {cache.evictable_size()} / {cache.protected_size()}"
            f" but the device nodes hold {device - protected} / {protected}"
        )


def device_values_flatten(cache: Any) -> list[int]:
    """Every device KV slot a host-tier cache holds, depth-first (host-only nodes hold none)."""
    values: list[int] = []
    stack = [cache.root]
    while stack:
        node = stack.pop()
        if node is not cache.root and node.value is not None:
            values += node.value
        stack.extend(reversed(node.children.values()))
    return values
