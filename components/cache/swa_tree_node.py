"""The sliding-window cache's node and slot helpers: ``SWATreeNode`` (a radix node with
sliding-window KV slots, a tombstone once they are evicted), EAGLE's bigram keys and the
helpers that sort given slots into kept, duplicate and tombstoned ones."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from schedkit.components.cache.tree_node import TreeNode

__all__ = [
    "SWATreeNode",
    "bigram_key",
    "collect_duplicates",
    "live_slots",
    "live_tail_start",
    "split_swa_fields",
    "to_bigrams",
]


class SWATreeNode(TreeNode):
    """A radix-tree node holding full-attention and sliding-window KV slots.

    ``lock_ref`` counts full-attention locks and ``swa_lock_ref`` sliding-window locks (a node
    with a sliding-window lock always has a full lock). ``swa_value`` is None for a tombstone.
    ``swa_uuid`` marks the node where some lock's sliding-window part stops.
    """

    __slots__ = ("swa_lock_ref", "swa_uuid", "swa_value")

    def __init__(
        self,
        key: list[int] | None = None,
        value: list[int] | None = None,
        parent: Any = None,
        namespace: Any = None,
        t: int | None = None,
        **kwargs: Any,
    ):
        super().__init__(key, value, parent, namespace, t, **kwargs)
        self.swa_value: list[int] | None = None
        self.swa_lock_ref = 0
        self.swa_uuid: int | None = None

    @property
    def tombstone(self) -> bool:
        """True when the node's sliding-window KV has been evicted."""
        return self.swa_value is None


def bigram_key(tokens: list) -> list[tuple[int, int]]:
    """EAGLE's bigram key: ``[1, 2, 3]`` -> ``[(1, 2), (2, 3)]`` (a key of bigrams stays)."""
    if tokens and type(tokens[0]) is tuple:
        return tokens
    return list(itertools.pairwise(tokens))


def to_bigrams(
    tokens: list[int], value: Sequence[int] | None, swa_value: Sequence | None
) -> tuple[list[tuple[int, int]], list[int] | None, list | None, list[int], list]:
    """EAGLE: the bigram key of ``tokens``, the slots it keeps (one per bigram), and the
    slots of a last token without a successor, for the caller to free (SGLang's
    cache_finished_req frees them)."""
    key = bigram_key(tokens)
    n = len(key)
    if value is None:
        return key, None, None, [], []
    value = list(value)
    if len(value) not in (n, len(tokens)):
        raise ValueError(
            f"value has {len(value)} slots for {len(tokens)} tokens ({n} bigrams); give "
            "one slot per token or per bigram"
        )
    swa_value = None if swa_value is None else list(swa_value)
    extra_swa = [] if swa_value is None else swa_value[n:]
    return key, value[:n], None if swa_value is None else swa_value[:n], value[n:], extra_swa


def live_slots(slots: list[int | None]) -> list[int]:
    """The slots that are not None (None: a token without sliding-window KV)."""
    return [s for s in slots if s is not None]


def live_tail_start(swa: list[int | None], page_size: int) -> int:
    """Where the trailing run of live SWA slots starts, rounded up to a page boundary."""
    i = len(swa)
    while i and swa[i - 1] is not None:
        i -= 1
    return -(-i // page_size) * page_size


def collect_duplicates(given: list, own: list[int], out: list[int]) -> None:
    """Add to ``out`` the given slots that are not the cache's own slot at the same position."""
    if given != own:
        out += [g for g, o in zip(given, own, strict=True) if g is not None and g != o]


def split_swa_fields(upper: SWATreeNode, lower: SWATreeNode, m: int) -> None:
    """Split the sliding-window fields of a node cut after ``m`` tokens into ``upper`` (the
    first ``m``) and ``lower`` (the rest)."""
    swa = lower.swa_value
    upper.swa_value = None if swa is None else swa[:m]
    if swa is not None:
        lower.swa_value = swa[m:]
    upper.swa_lock_ref = lower.swa_lock_ref
    # A lock whose window ended in ``lower`` now ends in the upper part.
    upper.swa_uuid, lower.swa_uuid = lower.swa_uuid, None
