"""Picking stored and removed pages out of a cache's KV events (shared by the cache tests).

Caches coalesce their events, so tests compare pages, not events: ``stored_pages`` flattens the
stored events into one token list per page, ``stored_links`` into ``(hash, parent hash)`` per
page.
"""

from schedkit.kv_events.structs import BlockRemoved, BlockStored


def stored(events):
    return [e for e in events if isinstance(e, BlockStored)]


def stored_hashes(events):
    return [h for e in stored(events) for h in e.block_hashes]


def stored_pages(events):
    pages = []
    for e in stored(events):
        assert len(e.token_ids) == e.block_size * len(e.block_hashes)
        size = e.block_size
        pages += [e.token_ids[i : i + size] for i in range(0, len(e.token_ids), size)]
    return pages


def stored_links(events):
    links = []
    for e in stored(events):
        parent = e.parent_block_hash
        for h in e.block_hashes:
            links.append((h, parent))
            parent = h
    return links


def removed_hashes(events):
    return [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
