"""Picking stored and removed pages out of a cache's KV events (shared by the cache tests)."""

from schedkit.kv_events.structs import BlockRemoved, BlockStored


def stored(events):
    return [e for e in events if isinstance(e, BlockStored)]


def stored_hashes(events):
    return [h for e in stored(events) for h in e.block_hashes]


def removed_hashes(events):
    return [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]


def stored_pages(events):
    """Every stored page as ``(hash, parent hash, token ids)``, coalesced events split again."""
    pages = []
    for e in stored(events):
        parent = e.parent_block_hash
        for i, h in enumerate(e.block_hashes):
            pages.append((h, parent, e.token_ids[i * e.block_size : (i + 1) * e.block_size]))
            parent = h
    return pages
