"""A decode step's (or a run of decode steps') streaming when the batch is the one seen at the
previous step: the same messages ``OutputStreamer.stream_output`` sends, built from the batch's
kept columns (``steady_stream``) and, for a sender that takes them, encoded from the kept
columns' encodings (``token_wire``)."""

from __future__ import annotations

from operator import attrgetter, itemgetter

from schedkit.components.io.cache_hit_details import details_column
from schedkit.components.io.io_struct import BatchTokenIDOutput, RequestTimes
from schedkit.components.io.steady_stream import NOT_STREAMING, SteadyColumns
from schedkit.components.io.token_wire import encode_columns, encode_step
from schedkit.core.schedule_batch import Req

__all__ = ["DecodeStepStream"]

_LAST_TOKEN = itemgetter(slice(-1, None))
_FINISHED_REASON = attrgetter("finished_reason")


class DecodeStepStream:
    """``stream_decode_step``, ``decode_run_steps`` and ``stream_decode_run`` of
    ``OutputStreamer``. Mixed into it; adds no fields.

    Uses the streamer's ``sender``, ``tree_cache``, ``parallel_state``, ``stream_interval``,
    ``force_stream_interval``, ``is_generation``, ``enable_hicache_storage``, ``get_load``,
    ``_steady``, ``_encoded``, ``_own_stream_output``, ``stream_output`` and
    ``_stream_output_generation``.
    """

    __slots__ = ()

    def stream_decode_step(self, reqs: list[Req], finished: list[Req]) -> None:
        """``stream_output(reqs)`` after a decode step in which each request of ``reqs`` got
        exactly one token; ``finished`` lists, in batch order, those that finished at this
        step, and none had finished before it.

        A batch seen at the previous call too keeps its unchanging columns (``SteadyStream``):
        when each request streams every token and none finished, the message is built from
        them with C-level maps over the requests; when none streams, only the requests that
        finished or reach a multiple of ``force_stream_interval`` tokens at this step are
        looked at. Any other batch goes through the per-request loop of ``stream_output``.
        """
        if not self.is_generation or not self._own_stream_output:
            self.stream_output(reqs, False)  # a subclass's own stream_output is honoured
            return
        columns = self._steady.columns(reqs, self.stream_interval, self.force_stream_interval)
        if columns is None:
            self._stream_output_generation(reqs, None, False)
            return
        due = columns.advance(self.force_stream_interval)
        if columns.kind == NOT_STREAMING:
            if finished or due:
                self._stream_output_generation(
                    columns.in_batch_order([*finished, *due]), None, False
                )
        else:
            self._stream_every_token(reqs, columns, finished)
        if finished:  # the scheduler drops them from the batch: keep the columns without them
            self._steady.keep_without(columns, finished, self.force_stream_interval)

    def decode_run_steps(self, reqs: list[Req], limit: int) -> int:
        """How many of the next ``limit`` decode steps of ``reqs`` (the next decode batch,
        none finished) ``stream_decode_run`` may stream at once: for the batch kept since the
        previous decode step, those before a request is due (none streaming); all when each
        request streams every token and the sender counts runs of messages
        (``send_decode_run``), for another batch too when each of its requests has sent every
        token it has (``SteadyStream.start_run``); else 0."""
        if not self.is_generation or not self._own_stream_output:
            return 0
        columns = self._steady.kept(reqs)
        if columns is None:
            if getattr(self.sender, "takes_decode_runs", False) is not True:
                return 0
            columns = self._steady.start_run(reqs, self.stream_interval, self.force_stream_interval)
            return 0 if columns is None else limit
        if columns.kind == NOT_STREAMING:
            return columns.quiet_steps(limit)
        return limit if getattr(self.sender, "takes_decode_runs", False) is True else 0

    def stream_decode_run(self, reqs: list[Req], steps: int) -> None:
        """``stream_decode_step(reqs, [])`` for ``steps`` decode steps (at most
        ``decode_run_steps``) in which each request got one token a step."""
        columns = self._steady.kept(reqs)
        columns.step += steps
        if columns.kind != NOT_STREAMING:
            columns.sent = list(map(len, columns.outputs))  # the columns write the offsets
            self.sender.send_decode_run(columns.rids, steps)

    def _stream_every_token(
        self, reqs: list[Req], columns: SteadyColumns, finished: list[Req]
    ) -> None:
        """Each request of a kept batch streams every token and got one since the previous
        call (which sent everything it had); ``finished`` finished at this step. One message
        with each request's last token, built one column at a time (encoded from the kept
        columns' encodings when the sender takes it encoded)."""
        outputs = columns.outputs
        lengths = columns.sent = list(map(len, outputs))  # the columns write the offsets
        reasons = load = time_stats = None
        if finished:
            reasons = list(map(_FINISHED_REASON, reqs))
            time_stats = _time_stats_of(reqs, finished)
            for req in finished:
                req.finished_output = True
            if self.get_load is not None:
                load = self.get_load()
        storage_enabled = self.enable_hicache_storage()
        details = columns.details
        if details is None or columns.storage_enabled != storage_enabled:
            details = columns.details = details_column(
                columns.members, storage_enabled, self.tree_cache
            )
            columns.storage_enabled = storage_enabled
            columns.wire = None
        dp_rank = self.parallel_state.dp_rank
        if self._encoded:
            wire = columns.wire
            if wire is None:
                wire = columns.wire = encode_columns(
                    columns.rids, columns.prompt_tokens, columns.cached_tokens, details
                )
            self.sender.send(
                encode_step(
                    wire,
                    outputs,
                    lengths,
                    columns.rids,
                    reasons,
                    [req.rid for req in finished],
                    dp_rank,
                    load,
                    time_stats,
                )
            )
            return
        # Copies of the kept columns: a receiver may keep or change the message's lists.
        self.sender.send(
            BatchTokenIDOutput(
                rids=columns.rids[:],
                finished_reasons=[None] * len(reqs) if reasons is None else reasons,
                output_ids=list(map(_LAST_TOKEN, outputs)),
                prompt_tokens=columns.prompt_tokens[:],
                completion_tokens=lengths,
                cached_tokens=columns.cached_tokens[:],
                cached_tokens_details=details[:],
                dp_rank=dp_rank,
                load=load,
                time_stats=time_stats,
            )
        )


def _time_stats_of(reqs: list[Req], finished: list[Req]) -> list[RequestTimes | None]:
    """``time_stats(reqs)`` when ``finished`` lists those of ``reqs`` that finished."""
    times = {
        req: RequestTimes(arrival_time=req.arrival_time, scheduled_time=req.scheduled_time)
        for req in finished
    }
    return list(map(times.get, reqs))
