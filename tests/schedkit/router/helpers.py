"""Candidates and event batches for the router tests."""

from __future__ import annotations

from schedkit.kv_events import BlockStored, KVEventBatch, page_hashes
from schedkit.router import Candidates, LoadBoard

PAGE = 4


def board(requests=None, *, tokens=None, queued=None, kv_usage=None, ranks=None) -> LoadBoard:
    """A load board whose workers have these figures (dicts by rank)."""
    ranks = sorted(ranks or requests or tokens or queued or kv_usage)
    loads = LoadBoard(ranks)
    for rank in ranks:
        w = loads[rank]
        w.requests = (requests or {}).get(rank, 0)
        w.prefill_tokens = (tokens or {}).get(rank, 0)
        w.queued = (queued or {}).get(rank, 0)
        w.kv_usage = (kv_usage or {}).get(rank, 0.0)
    return loads


def candidates(matched, loads, cached=None, prompt_tokens=16, now=0.0, session=None):
    """Candidates over the ranks of ``loads`` (a LoadBoard, or requests by rank)."""
    if not isinstance(loads, LoadBoard):
        loads = board(loads)
    cached = cached or {}
    return Candidates(
        ranks=sorted(loads.workers),
        token_ids=list(range(1000, 1000 + prompt_tokens)),
        page_size=PAGE,
        loads=loads,
        now=now,
        matched=matched,
        cached_pages=lambda r: cached.get(r, 0),
        session=session,
    )


def stored(tokens: list[int]) -> KVEventBatch:
    """One BlockStored per page of ``tokens``, chained as a cache publishes them."""
    hashes = page_hashes(tokens, PAGE)
    parents = [None, *hashes[:-1]]
    events = [
        BlockStored([h], parent, tokens[i * PAGE : (i + 1) * PAGE], PAGE, None, "GPU")
        for i, (h, parent) in enumerate(zip(hashes, parents, strict=True))
    ]
    return KVEventBatch(ts=0.0, events=events)
