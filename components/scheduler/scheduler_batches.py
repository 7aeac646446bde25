"""The scheduler's batch forming: the next prefill batch, the decode batch, retraction."""

from __future__ import annotations

import structlog

from schedkit.components.scheduler.decode_slots import retract_decode, take_decode_slots
from schedkit.components.scheduler.prefill_adder import PrefillAdder
from schedkit.core.schedule_batch import Req, ScheduleBatch

__all__ = ["SchedulerBatches"]

# The scheduler's logger: its records name the scheduler whichever part of it logs.
log = structlog.get_logger("schedkit.components.scheduler.scheduler")


class SchedulerBatches:
    """``get_next_batch_to_run`` of ``Scheduler``: a prefill batch formed by ``PrefillAdder``
    (shared between clients by ``client_share`` when set), else the running batch given its
    next KV slots, retracting requests when the pool is short. Mixed into it; adds no fields.

    Uses the scheduler's ``waiting_queue``, ``running_batch``, ``chunked_req``, ``policy``,
    ``now``, the limits (``max_running_requests``, ``max_prefill_tokens``,
    ``chunked_prefill_size``), the prefill counters, ``_kv``, ``_ratio``, ``_client_share``,
    ``_prefill_blocked``, ``num_retracted`` and ``_finish_aborted``.
    """

    __slots__ = ()

    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        """A prefill batch when one can be formed, else the decode batch, else None."""
        return self.get_new_batch_prefill() or self.update_running_batch()

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        """Continue the chunked request, then admit waiting requests in policy order until
        the first that does not fit (``PrefillAdder``); with ``client_of``, as the clients'
        shares allow (``client_share``)."""
        share, chunked = self._client_share, self.chunked_req
        defer_chunk = False
        if share is not None and (self.waiting_queue or chunked) and not self._prefill_blocked:
            self._retract_for_share(
                share.plan(self.running_batch.reqs, chunked, self.waiting_queue)
            )
            defer_chunk = chunked is not None and share.defers(chunked)
        running = self.running_batch.reqs
        if self._prefill_blocked or (
            chunked is None
            and (not self.waiting_queue or len(running) >= self.max_running_requests)
        ):
            return None
        adder = PrefillAdder(
            self._kv,
            running,
            self._ratio.value,
            self.max_prefill_tokens,
            self.chunked_prefill_size,
            self.max_running_requests,
        )
        if self._step_bound is not None:
            adder.tokens_at = self._step_bound.tokens_at
        if chunked is not None and not defer_chunk and not adder.add_chunked_req(chunked):
            adder.new_chunked_req = chunked  # its next chunk waits for room
        if adder.new_chunked_req is None:
            waiting = self.waiting_queue
            if share is not None:
                admitted = share.admit(adder, waiting, self.policy.calc_priority, defer_chunk)
            else:
                self.policy.calc_priority(waiting)
                admitted = adder.add_in_order(waiting)
            if admitted:
                now = self.now()
                for req in waiting[:admitted]:
                    req.wait_queue_exit_time = now
                    if req.scheduled_time is None:
                        req.scheduled_time = now
                del waiting[:admitted]
        if defer_chunk:  # a lighter client's requests go first, unless nothing else can run
            if adder.batch.reqs or running:
                adder.new_chunked_req = chunked  # its next chunk waits
            elif not adder.add_chunked_req(chunked):
                adder.new_chunked_req = chunked  # its next chunk waits for room
        self.chunked_req = adder.new_chunked_req
        if not adder.batch.reqs:
            # Nothing fits until a running request leaves (decoding goes on meanwhile).
            self._prefill_blocked = bool(running)
            return None
        batch = adder.batch
        self.processed_prefill_tokens += sum(batch.extend_lens)
        self.prefill_tokens_computed += sum(batch.extend_lens)
        self.prefill_tokens_cached += sum(batch.cache_hit_lens)
        self.prefill_tokens_cached_host += batch.host_hit_tokens
        return batch

    def update_running_batch(self) -> ScheduleBatch | None:
        """Give every running request one KV slot for its next token, retracting requests
        when the pool is short; the decode batch, or None if nothing runs."""
        batch = self.running_batch
        if not batch.reqs:
            return None
        if take_decode_slots(self._kv, batch.reqs):
            self._ratio.decay()
            return batch
        self._retract_decode()
        if not batch.reqs:
            return None
        take_decode_slots(self._kv, batch.reqs)  # the retraction made room for these
        return batch

    def _retract_decode(self) -> None:
        """Retract running requests (``retract_decode``) and requeue them at the back of the
        waiting queue; a chunked request goes too if that is still not enough, and a last
        request that cannot get one more slot is aborted ("out of memory")."""
        batch, kv = self.running_batch, self._kv
        keep, retracted, need = retract_decode(kv, batch.reqs, self._retract)
        if not kv.ensure_free(need) and self.chunked_req is not None:
            retracted.append(self.chunked_req)
            self._retract(self.chunked_req)
            self.chunked_req = None
        gone = set(retracted)
        if keep and not kv.ensure_free(need):
            last = keep.pop()
            log.error("out of KV memory for the last running request; aborting it", rid=last.rid)
            gone.add(last)
            batch.reqs = [r for r in batch.reqs if r not in gone]
            kv.release(last)
            self._finish_aborted(last, "out of memory: the KV pool cannot hold its next token")
        batch.reqs = [r for r in batch.reqs if r not in gone]
        self.waiting_queue.extend(retracted)
        decoded = sum(len(r.output_ids) for r in keep)
        total = sum(r.sampling_params.max_new_tokens for r in keep)
        self._ratio.after_retract(decoded, len(keep), total)
        log.info("retracted requests", count=len(retracted), new_token_ratio=self._ratio.value)

    def _retract_for_share(self, retract: list[Req]) -> None:
        """Retract running requests of clients over their share (``client_share``) to the back
        of the waiting queue."""
        if not retract:
            return
        gone = set(retract)
        self.running_batch.reqs = [r for r in self.running_batch.reqs if r not in gone]
        for req in retract:
            self._retract(req)
        self.waiting_queue.extend(retract)
        log.info("retracted requests over their client's share", count=len(retract))

    def _retract(self, req: Req) -> None:
        self._kv.release(req)
        req.reset_for_retract()
        req.wait_queue_entry_time = self.now()
        self.num_retracted += 1
        self._prefill_blocked = False
