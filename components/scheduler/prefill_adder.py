"""One prefill pass's admission, after SGLang's ``schedule_policy.PrefillAdder``."""

from __future__ import annotations

from collections.abc import Callable

from schedkit.components.cache.cache_keys import prefix_match_key
from schedkit.components.scheduler.kv_slots import KVSlots
from schedkit.components.scheduler.new_token_ratio import remaining_new_tokens
from schedkit.core.schedule_batch import ForwardMode, Req, ScheduleBatch

__all__ = ["PrefillAdder"]


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
