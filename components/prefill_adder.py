"""One prefill pass's admission, after SGLang's ``PrefillAdder``: which waiting requests (and
how much of a chunked one) fit the token budgets and the KV room left for running requests."""

from __future__ import annotations

from schedkit.components.kv_slots import KVSlots
from schedkit.components.req_to_cache import prefix_match_key
from schedkit.components.schedule_batch import ForwardMode, Req, ScheduleBatch

__all__ = ["CLIP_MAX_NEW_TOKENS", "PrefillAdder", "remaining_new_tokens"]

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
        ext = min(req.seqlen - pre, self.rem_chunk, int(room))
        if ext <= 0 or not self.kv.extend(req, ext):
            return False
        self._add(req, pre, ext, 0)  # its prefix is its own earlier chunks: no cache hit
        return True

    def add_one_req(self, req: Req) -> bool:
        """Admit ``req`` if it fits; False means stop admitting (SGLang admits in order)."""
        kv, tree_cache = self.kv, self.kv.tree_cache
        if type(req.origin_input_ids) is not list:  # packed while it waited (array('I'))
            req.origin_input_ids = req.origin_input_ids.tolist()
        seqlen = req.seqlen
        match = tree_cache.match_prefix(prefix_match_key(req, kv.page_size))
        pre = len(match.device_indices)
        ext = seqlen - pre
        if ext > self.rem_input and self.batch.reqs:
            return False
        lock = tree_cache.inc_lock_ref(match.last_node)
        room = kv.room() - self.reserved
        if ext > self.rem_chunk:
            ext = self.rem_chunk - self.rem_chunk % kv.page_size
        req.kv_indices = match.device_indices
        if seqlen - pre + remaining_new_tokens(req) > room or ext <= 0 or not kv.extend(req, ext):
            req.kv_indices = []
            tree_cache.dec_lock_ref(match.last_node, lock)
            return False
        # A retracted request counts its re-used prefix again, as in SGLang.
        req.last_node, req.swa_uuid_for_lock, req.prefix_len = match.last_node, lock, pre
        req.cached_tokens += pre
        req.cached_tokens_device += pre
        self._add(req, pre, ext, pre)
        return True

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
        self.rem_input -= ext
        self.rem_chunk -= ext
