"""A decode step's KV slots, and the retraction when the pool runs short, after SGLang's
``ScheduleBatch.prepare_for_decode`` and ``retract_decode``."""

from __future__ import annotations

from collections.abc import Callable

from schedkit.components.scheduler.kv_slots import KVSlots
from schedkit.components.scheduler.new_token_ratio import (
    RETRACT_DECODE_STEPS,
    remaining_new_tokens,
)
from schedkit.core.schedule_batch import Req

__all__ = ["retract_decode", "take_decode_slots"]


def take_decode_slots(kv: KVSlots, reqs: list[Req]) -> bool:
    """Give every request one KV slot for its next token: the next slot of its last page if
    that page has room, else a new page. False, with nothing taken, if the pool cannot supply
    the new pages even after evicting from the cache."""
    if kv.decode_pages is not None:
        return kv.decode_pages.take(reqs)
    page_size = kv.page_size
    needs_page = []
    for req in reqs:
        slots = req.kv_indices
        if len(slots) % page_size:
            slots.append(slots[-1] + 1)
        else:
            needs_page.append(req)
    if not needs_page:
        return True
    if not kv.ensure_free(len(needs_page) * page_size):
        waiting = set(needs_page)
        for req in reqs:  # undo: nothing is taken
            if req not in waiting:
                req.kv_indices.pop()
        return False
    pages = kv.allocator.alloc(len(needs_page) * page_size)[::page_size]
    for req, slot in zip(needs_page, pages, strict=True):
        req.kv_indices.append(slot)
    return True


def retract_decode(
    kv: KVSlots, reqs: list[Req], retract: Callable[[Req], None]
) -> tuple[list[Req], list[Req], int]:
    """SGLang's ``retract_decode``: retract unfinished requests, fewest output tokens (then
    longest prompt) first, until the rest have room for a few decode steps, keeping at least
    one. ``retract(req)`` frees a request's KV. Returns the requests kept, those retracted
    (in retraction order) and the slots the kept ones need for their next token."""
    keep = sorted(
        (r for r in reqs if r.finished_reason is None),
        key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)),
        reverse=True,
    )
    retracted: list[Req] = []
    room = sum(min(RETRACT_DECODE_STEPS, remaining_new_tokens(r)) for r in keep)
    need = kv.decode_need(keep)
    while len(keep) > 1:
        if retracted and kv.ensure_free(max(room, need)):
            break
        req = keep.pop()
        room -= min(RETRACT_DECODE_STEPS, remaining_new_tokens(req))
        need -= kv.decode_need([req])
        retracted.append(req)
        retract(req)
    return keep, retracted, need
