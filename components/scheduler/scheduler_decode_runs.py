"""Several decode steps of an unchanging batch in one call: the scheduler's side of a decode
run, which the model runner and the batch result processor take as a whole."""

from __future__ import annotations

from schedkit.core.protocols import DecodeStepCounter

__all__ = ["SchedulerDecodeRuns"]


class SchedulerDecodeRuns:
    """``run_decode_steps`` of ``Scheduler``. Mixed into it; adds no fields.

    Uses the scheduler's ``request_receiver``, ``model_runner``, ``batch_result_processor``,
    ``running_batch``, ``waiting_queue``, ``chunked_req``, ``paused``,
    ``max_running_requests``, ``_forward_decode_run``, ``_kv``, ``_ratio``, ``_client_share``,
    ``_prefill_blocked`` and ``_take_received``.
    """

    __slots__ = ()

    def run_decode_steps(
        self, max_steps: int, until: float, origin: float, counter: DecodeStepCounter
    ) -> tuple[list[float], list[tuple[int, int]]] | None:
        """Up to ``max_steps`` loop iterations at once, when each would only run the
        unchanging decode batch: nothing arrives, no prefill can be formed, no request
        finishes, the pages they need are free without evicting, each step starts before
        ``until`` seconds after ``origin`` on the model runner's clock and none is a step
        ``counter`` (the metrics reporter) reports at but the last. Every figure is what as
        many ``step`` calls give: tokens, token times, KV slots, the new-token ratio, streamed
        messages, counters. Returns each step's end time on the runner's clock and the steps
        (counted from 0) that took new KV pages with the slots each took; None, with nothing
        run, when the next iteration is not such a step (``step`` runs it). Needs a model
        runner with ``forward_decode_run``, a batch result processor with
        ``process_decode_run`` and pages of more than one slot."""
        forward_run, pages = self._forward_decode_run, self._kv.decode_pages
        if forward_run is None or pages is None:
            return None
        received = self.request_receiver.recv_requests()
        if received:
            self._take_received(received)  # what step() does first; it runs the rest
            return None
        reqs = self.running_batch.reqs
        if (
            self.paused
            or not reqs
            or self.chunked_req is not None
            or (
                self.waiting_queue
                and not self._prefill_blocked
                # a client share may retract running requests for a waiting one
                and (len(reqs) < self.max_running_requests or self._client_share is not None)
            )
        ):
            return None
        processor = self.batch_result_processor
        limit = min(max_steps, counter.decode_steps_to_report())
        limit = processor.decode_run_steps(reqs, limit, self.model_runner.now())
        if limit > 0:
            limit = pages.steps_in_pool(reqs, limit)
        if limit <= 0:
            return None
        eos = getattr(processor, "eos_token_id", None)
        times, tokens = forward_run(reqs, limit, until, origin, eos)
        if not times:
            return None
        steps = len(times)
        taken = pages.take_run(reqs, steps)
        self._ratio.decay_run(steps)
        processor.process_decode_run(self.running_batch, tokens, times, counter)
        return times, taken
