"""What fits in the next batch, after SGLang's ``schedule_policy.PrefillAdder`` and
``ScheduleBatch.retract_decode``: the scheduler's KV slots (pool plus evictable cache), the
new-token ratio that keeps room for running requests' remaining output, one prefill pass's
admission, and a decode step's slots and retractions."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from schedkit.components.cache.cache_keys import prefix_match_key
from schedkit.components.cache.req_locks import unlock_req
from schedkit.components.scheduler.decode_pages import DecodePages
from schedkit.core.protocols import KVAllocator, PrefixCache
from schedkit.core.schedule_batch import ForwardMode, Req, ScheduleBatch

__all__ = [
    "CLIP_MAX_NEW_TOKENS",
    "RETRACT_DECODE_STEPS",
    "KVSlots",
    "NewTokenRatio",
    "PrefillAdder",
    "remaining_new_tokens",
    "retract_decode",
    "take_decode_slots",
]

# After a retraction, the remaining requests must have room for this many decode steps.
RETRACT_DECODE_STEPS = 20


@attrs.define(slots=True)
class NewTokenRatio:
    """The share of each running request's remaining tokens that admission reserves.

    It starts at ``init``, falls linearly to ``minimum`` over ``decay_steps`` decode steps that
    found room (at once when ``minimum`` is above ``init``, as SGLang's decay does), is set after
    a retraction from what the kept requests still need (SGLang's estimate), and goes back to
    ``init`` when the scheduler idles or its cache is flushed.
    """

    init: float = 0.7
    minimum: float = 0.098
    decay_steps: int = 600
    value: float = attrs.field(init=False)
    _step: float = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        for name, ratio in (
            ("init_new_token_ratio", self.init),
            ("min_new_token_ratio", self.minimum),
        ):
            if not 0.0 <= ratio <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {ratio}")
        self.value = self.init
        self._step = (self.init - self.minimum) / self.decay_steps

    @classmethod
    def conservative(
        cls, init: float, minimum: float, decay_steps: int, conservativeness: float
    ) -> NewTokenRatio:
        """SGLang's ``schedule_conservativeness``: ``init`` scaled by it (at most 1) and the
        minimum kept at the same fraction of the scaled ``init`` (at most 1)."""
        if not conservativeness >= 0.0:
            raise ValueError(f"schedule_conservativeness must be >= 0, got {conservativeness}")
        if conservativeness == 1.0:
            return cls(init, minimum, decay_steps)
        scaled = min(init * conservativeness, 1.0)
        floor = min(scaled * minimum / init, 1.0) if init else min(minimum * conservativeness, 1.0)
        return cls(scaled, floor, decay_steps)

    def decay(self) -> None:
        """One decode step went well: reserve a little less."""
        self.value = max(self.value - self._step, self.minimum)

    def decay_run(self, steps: int) -> None:
        """``steps`` decode steps went well: ``decay`` as many times."""
        value, step, minimum = self.value, self._step, self.minimum
        for _ in range(steps):
            if value == minimum and step >= 0:
                break  # it stays there
            value = max(value - step, minimum)
        self.value = value

    def reset(self) -> None:
        """Back to the initial ratio."""
        self.value = self.init

    def after_retract(self, decoded: int, running: int, max_new_tokens: int) -> None:
        """Set from the kept requests as SGLang estimates it: ``decoded`` of their
        ``max_new_tokens`` tokens are out and ``running`` requests need room for a few more
        steps each, over ``max_new_tokens + 1`` (0.0 when nothing is kept), at most 1."""
        needed = decoded + RETRACT_DECODE_STEPS * running
        self.value = min(1.0, needed / (max_new_tokens + 1))


@attrs.define(slots=True)
class KVSlots:
    """The allocator and prefix cache of one scheduler, with the operations admission and
    decoding share. A request holds one slot per token that has KV (``req.kv_indices``): its
    cached prefix first (``req.prefix_len`` slots, the cache's, locked through
    ``req.last_node``), then the slots it computed itself."""

    allocator: KVAllocator
    tree_cache: PrefixCache
    page_size: int
    # With pages of several slots, decode steps take their slots through this (see
    # ``decode_pages``); with single-slot pages every step allocates for every request.
    decode_pages: DecodePages | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self.page_size > 1:
            self.decode_pages = DecodePages(self)

    def room(self) -> int:
        """Slots free now or once the cache evicts what it may."""
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    def ensure_free(self, n: int) -> bool:
        """Make ``n`` slots free, evicting from the cache if needed; True if they are free."""
        shortfall = n - self.allocator.available_size()
        if shortfall > 0:
            self.tree_cache.evict(shortfall)
            return self.allocator.available_size() >= n
        return True

    def decode_need(self, reqs: Iterable[Req]) -> int:
        """Slots a decode step over ``reqs`` takes from the pool (whole pages)."""
        page_size = self.page_size
        if page_size == 1:
            return len(list(reqs))
        return page_size * [len(r.kv_indices) % page_size for r in reqs].count(0)

    def extend(self, req: Req, n: int) -> bool:
        """Append ``n`` KV slots to ``req.kv_indices``, filling its last page first; False
        (and nothing taken) if the pool cannot supply them."""
        kv, page_size = req.kv_indices, self.page_size
        in_page = min(n, -len(kv) % page_size)
        rest = n - in_page
        pages = -(-rest // page_size)
        if not self.ensure_free(pages * page_size):
            return False
        slots = self.allocator.alloc(pages * page_size)
        if in_page:
            kv.extend(range(kv[-1] + 1, kv[-1] + 1 + in_page))
        kv.extend(slots if rest == len(slots) else slots[:rest])
        return True

    def release(self, req: Req) -> None:
        """Free the slots the request computed itself and unlock its cached prefix (which
        the cache keeps); nothing of the request is inserted into the cache."""
        own = req.kv_indices[req.prefix_len :]
        if own:
            self.allocator.free(own)
        unlock_req(self.tree_cache, req)
        req.kv_indices = []
        req.last_node = None
        req.swa_uuid_for_lock = None


# Admission counts at most this many future tokens per request (SGLang's value).
CLIP_MAX_NEW_TOKENS = 4096


def remaining_new_tokens(req: Req) -> int:
    """The output tokens ``req`` may still produce, clipped as SGLang clips them."""
    return min(req.sampling_params.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS)


class PrefillAdder:
    """Builds one prefill batch within three budgets: ``max_prefill_tokens`` new tokens,
    ``chunked_prefill_size`` tokens per chunk, and the KV room left after reserving
    ``new_token_ratio`` of every running (and newly admitted) request's remaining output.

    ``add_chunked_req`` continues a partly prefilled request; ``add_one_req`` admits a waiting
    request (matching its cached prefix, locking it and taking slots for the rest) and says
    whether admission may go on. A request cut short by the chunk budget ends up in
    ``new_chunked_req``.
    """

    def __init__(
        self,
        kv: KVSlots,
        running: list[Req],
        new_token_ratio: float,
        max_prefill_tokens: int,
        chunked_prefill_size: int | None,
        max_running_requests: int,
    ) -> None:
        self.kv = kv
        self.new_token_ratio = new_token_ratio
        self.reserved = new_token_ratio * sum(map(remaining_new_tokens, running))
        self.rem_input = max_prefill_tokens
        self.rem_chunk = chunked_prefill_size or 1 << 62
        self.free_seats = max_running_requests - len(running)
        self.batch = ScheduleBatch(reqs=[], forward_mode=ForwardMode.EXTEND)
        self.new_chunked_req: Req | None = None
        # Set (``prefill_step_bound``): the fresh tokens a step may take after a prefix.
        self.tokens_at: Callable[[int], int] | None = None
        self._deepest = 0

    def fits_whole(self, req: Req) -> bool:
        """Whether ``req``'s whole prompt fits what is left of this step, whatever of it is
        cached (so admitting it starts no chunked request)."""
        return req.seqlen <= self._step_room(req.seqlen)

    def _step_room(self, pre: int) -> int:
        """Fresh tokens the step's time bound leaves for a request after ``pre`` tokens."""
        if self.tokens_at is None:
            return self.rem_chunk
        deepest = max(self._deepest, pre)
        return min(self.rem_chunk, self.tokens_at(deepest) - sum(self.batch.extend_lens))

    def budget_left(self) -> bool:
        """Whether another request could still be admitted in this pass."""
        return (
            self.new_chunked_req is None
            and self.rem_input > 0
            and self.rem_chunk > 0
            and len(self.batch.reqs) < self.free_seats
        )

    def add_chunked_req(self, req: Req) -> bool:
        """Prefill the next chunk of ``req``; False if no room for any of it."""
        pre = len(req.kv_indices)
        room = self.kv.room() - self.reserved
        ext = min(req.seqlen - pre, self._step_room(pre), int(room))
        if ext <= 0 or not self.kv.extend(req, ext):
            return False
        self._add(req, pre, ext, 0)  # its prefix is its own earlier chunks: no cache hit
        return True

    def add_one_req(self, req: Req) -> bool:
        """Admit ``req`` if it fits; False means stop admitting (SGLang admits in order)."""
        kv, tree_cache = self.kv, self.kv.tree_cache
        seqlen = req.seqlen
        match = tree_cache.match_prefix(prefix_match_key(req, kv.page_size))
        device, last_node, loaded = match.device_indices, match.last_node, 0
        if match.host_hit_length:  # host-tier pages: copy them back to the device first
            new, last_node = tree_cache.init_load_back(match.last_host_node)
            if new:
                device, loaded = device + new, len(new)
        pre = len(device)
        ext = seqlen - pre
        if ext > self.rem_input and self.batch.reqs:
            return False
        lock = tree_cache.inc_lock_ref(last_node)
        room = kv.room() - self.reserved
        chunk = self._step_room(pre)
        if ext > chunk:
            ext = chunk - chunk % kv.page_size
        req.kv_indices = device
        if seqlen - pre + remaining_new_tokens(req) > room or ext <= 0 or not kv.extend(req, ext):
            req.kv_indices = []
            tree_cache.dec_lock_ref(last_node, lock)
            return False
        # A retracted request counts its re-used prefix again, as in SGLang.
        req.last_node, req.swa_uuid_for_lock, req.prefix_len = last_node, lock, pre
        req.cached_tokens += pre
        req.cached_tokens_device += pre - loaded
        if loaded:
            req.cached_tokens_host += loaded
            self.batch.host_hit_tokens += loaded
        self._add(req, pre, ext, pre)
        return True

    def add_in_order(self, waiting: list[Req]) -> int:
        """Admit ``waiting`` in its order until the first that does not fit or the pass is
        full (SGLang's rule); how many were admitted, from the front."""
        admitted = 0
        while admitted < len(waiting) and self.budget_left():
            if not self.add_one_req(waiting[admitted]):
                break
            admitted += 1
        return admitted

    def _add(self, req: Req, pre: int, ext: int, hit: int) -> None:
        req.is_chunked = pre + ext < req.seqlen
        if req.is_chunked:
            self.new_chunked_req = req
        else:
            self.reserved += remaining_new_tokens(req)
        batch = self.batch
        batch.reqs.append(req)
        batch.prefix_lens.append(pre)
        batch.extend_lens.append(ext)
        batch.cache_hit_lens.append(hit)
        self._deepest = max(self._deepest, pre)
        self.rem_input -= ext
        self.rem_chunk -= ext


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
