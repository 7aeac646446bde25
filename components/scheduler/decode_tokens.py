"""A decode step's per-request bookkeeping done once per step for the whole batch.

After a decode step every request of the batch has one more token, a token time (the step's)
and an inter-token latency (the gap since its previous token); a few have reached their length
limit. ``DecodeTokens`` keeps, for the requests of the batch it saw last:

- their ``output_ids`` lists, so that appending the step's tokens touches no request;
- one shared log of step times instead of a time and a gap per request: a request's
  ``last_token_time`` and ``itl`` are written from the log only when they are read or set
  (``Req.last_token_time`` and ``Req.itl`` call ``complete`` or ``leave``), or when the
  request leaves the batch; the gaps are the same subtractions the per-request code made;
- each request filed under the step at which it reaches ``max_new_tokens``, so that only
  those, the requests with stop tokens and those given the EOS token are checked.

A step's batch is compared with the previous one (a list comparison, by identity, at C speed):
requests that left are written out and dropped, requests that joined are filed. The time log
is cut every ``TIME_LOG_STEPS`` steps (every member written out first), so it stays bounded.
"""

from __future__ import annotations

from operator import attrgetter, sub

from schedkit.core.schedule_batch import Req

__all__ = ["TIME_LOG_STEPS", "DecodeTokens"]

# The time log is emptied (its members' times written out) when it reaches this many steps.
TIME_LOG_STEPS = 4096

_append = list.append
_OUTPUT_IDS = attrgetter("output_ids")
_FINISHED_REASON = attrgetter("finished_reason")


class DecodeTokens:
    """The decode-step bookkeeping of one batch result processor."""

    __slots__ = (
        "_due",
        "_member_set",
        "_members",
        "_outputs",
        "_position",
        "_stoppers",
        "_times",
        "_times_from",
        "none_finished_before",
        "step",
    )

    def __init__(self) -> None:
        # Decode steps seen so far; a member's times are complete up to ``req.time_run_step``.
        self.step = 0
        # No request of the batch had finished when the batch was last regrouped.
        self.none_finished_before = True
        self._members: list[Req] | None = None
        self._member_set: set[Req] = set()
        self._position: dict[Req, int] | None = None
        self._outputs: list[list[int]] = []
        self._stoppers: list[Req] = []
        # Step -> members that reach max_new_tokens with that step's token.
        self._due: dict[int, list[Req]] = {}
        # The time of each step from step ``_times_from`` on (None without a clock).
        self._times: list[float | None] = []
        self._times_from = 0

    def advance(
        self, reqs: list[Req], tokens: list[int], now: float | None, eos: int | None
    ) -> list[Req]:
        """Append each request's token and stamp the step's time; returns, in batch order,
        the requests that may have finished (at their length limit, with stop tokens, or
        given ``eos``) for the caller to check."""
        if reqs != self._members:
            self._regroup(reqs, now is not None)
        any(map(_append, self._outputs, tokens))  # list.append returns None: runs through
        step = self.step
        times = self._times
        if len(times) >= TIME_LOG_STEPS:
            self._cut_log()
        times.append(now)
        self.step = step + 1
        maybe = self._due.pop(step, None)
        members = self._member_set
        if maybe:
            maybe = [req for req in maybe if req in members]
        if self._stoppers:
            maybe = (maybe or []) + self._stoppers
        if eos is not None and eos in tokens:
            maybe = (maybe or []) + [r for r, t in zip(reqs, tokens, strict=True) if t == eos]
        if not maybe:
            return []
        if len(maybe) > 1:
            if self._position is None:
                self._position = dict(zip(reqs, range(len(reqs)), strict=True))
            maybe = sorted(set(maybe), key=self._position.__getitem__)
        return maybe

    def quiet_steps(self, reqs: list[Req]) -> int:
        """How many decode steps of ``reqs`` (the next decode batch, timed) from now on cannot
        finish a request by its length (0 if one of its requests has stop tokens or had
        finished): the steps ``advance_run`` may take. A batch other than the last step's is
        regrouped first, as ``advance`` would."""
        if reqs != self._members:
            self._regroup(reqs, True)
        if self._stoppers or not self.none_finished_before:
            return 0
        due = self._due
        if not due:
            return TIME_LOG_STEPS
        return min(min(due) - self.step, TIME_LOG_STEPS)

    def advance_run(self, tokens: list[list[int]], times: list[float]) -> None:
        """``len(times)`` decode steps of the batch of ``quiet_steps`` (at most as many as it
        gave, none giving a request ``eos``): each request's tokens (in batch order)
        appended, each step's end time logged, as as many ``advance`` calls would."""
        any(map(list.extend, self._outputs, tokens))  # list.extend returns None: runs through
        log = self._times
        if len(log) + len(times) > TIME_LOG_STEPS:
            self._cut_log()
        log += times
        self.step += len(times)

    def complete(self, req: Req) -> None:
        """Write the token times and inter-token latencies of the steps ``req`` took part in
        since they were last written."""
        start, end = req.time_run_step, self.step
        if start >= end:
            return
        base = self._times_from
        steps = self._times[start - base : end - base]
        last, itl = req._last_token_time, req._itl
        if last is not None:
            itl.append(steps[0] - last)
        if len(steps) > 1:
            itl.extend(map(sub, steps[1:], steps))
        req._last_token_time = steps[-1]
        req.time_run_step = end

    def leave(self, req: Req) -> None:
        """Write ``req``'s times and stop keeping anything for it (one of its fields is being
        set, or it is handled outside a decode step)."""
        self._drop(req)
        self._member_set.discard(req)
        self._members = None  # the next step regroups even if its batch is the same list
        self._position = None
        if req in self._stoppers:
            self._stoppers.remove(req)

    def __contains__(self, req: Req) -> bool:
        return req in self._member_set

    def disband(self) -> None:
        """Write out every member and forget the batch (the next step starts afresh)."""
        for req in self._member_set:
            self._drop(req)
        self._member_set = set()
        self._members = None
        self._position = None
        self._stoppers = []

    def _regroup(self, reqs: list[Req], timed: bool) -> None:
        new = set(reqs)
        old = self._member_set
        for req in old - new:
            self._drop(req)
        entering = new - old
        for req in entering:
            self._file(req, timed)
        self._members = list(reqs)
        self._member_set = new
        self._position = None
        self._outputs = list(map(_OUTPUT_IDS, reqs))
        self.none_finished_before = not any(map(_FINISHED_REASON, reqs))
        self._stoppers = [req for req in self._stoppers if req in new] + [
            req for req in entering if req.sampling_params.stop_token_ids
        ]

    def _file(self, req: Req, timed: bool) -> None:
        if timed:
            if req.time_run is not None:
                req.time_run.leave(req)
            req.time_run = self
            req.time_run_step = self.step
        step = self.step + max(0, req.sampling_params.max_new_tokens - len(req.output_ids) - 1)
        self._due.setdefault(step, []).append(req)

    def _drop(self, req: Req) -> None:
        if req.time_run is self:
            self.complete(req)
            req.time_run = None
        # Where _file put it (the step whose token brings it to max_new_tokens), unless that
        # step has passed.
        at = self.step + req.sampling_params.max_new_tokens - len(req.output_ids) - 1
        filed = self._due.get(at)
        if filed is not None and req in filed:
            filed.remove(req)
            if not filed:
                del self._due[at]

    def _cut_log(self) -> None:
        for req in self._member_set:
            if req.time_run is self:
                self.complete(req)
        self._times.clear()
        self._times_from = self.step
