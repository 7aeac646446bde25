"""How an offline fleet steps its workers: each up to the next arrival, or the one behind."""

from __future__ import annotations

import heapq
import time

__all__ = ["OfflineStepping"]

# Steps whose news may wait for the router before it is given them (bounds the backlog).
_MAX_BACKLOG = 1 << 14
# Simulated seconds that workers run ahead of the one furthest behind between two arrivals.
_HORIZON = 1.0


class OfflineStepping:
    """``_run_ahead`` and ``_run_behind`` of ``OfflineFleet``, the two ways its loop steps
    the busy workers (see ``schedkit.fleet.offline``). Mixed into ``OfflineFleet``.

    Uses the fleet's ``steppers``, busy heap (``_busy``, ``_queued``), ``news`` (what the
    router is told), ``decode_runs``, ``step_wall`` and ``_worker_ended``.
    """

    __slots__ = ()

    def _run_ahead(self, due: float) -> None:
        """Step every busy worker whose clock is behind a horizon (``due`` seconds, or
        ``_HORIZON`` past the one furthest behind if sooner) up to it, one worker after the
        other, then hand over the requests that ended in the order of the steps that ended
        them (by start time, then rank), as ``_run_behind`` would have met them. Only when
        requests ending change nothing before ``due`` (see ``run``)."""
        busy, steppers, after_step = self._busy, self.steppers, self.news.after_step
        floor = busy[0][0]
        if self.news.backlog > _MAX_BACKLOG:
            self.news.catch_up(floor)
        horizon = min(due, floor + _HORIZON)
        behind = []
        while busy and busy[0][0] < horizon:
            behind.append(heapq.heappop(busy)[1])
        ended = []
        after_run, runs = self.news.after_run, self.decode_runs
        for rank in behind:
            self._queued[rank] = False
            stepper = steppers[rank]
            elapsed, step, run_decode = stepper.elapsed, stepper.step, stepper.run_decode
            step_wall = 0.0
            clock = elapsed()
            while clock < horizon:
                start = clock
                started = time.perf_counter()
                run = run_decode(horizon) if runs else None
                if run is not None:
                    step_wall += time.perf_counter() - started
                    ends, taken = run
                    clock = ends[-1]
                    after_run(rank, start, ends, taken)
                    continue
                _, finished = step()
                step_wall += time.perf_counter() - started
                clock = elapsed()
                after_step(rank, finished, start, clock)
                if finished:
                    ended.append((start, rank, clock, finished))
                    if not stepper.inflight:
                        break
            self.step_wall[rank] += step_wall
            if stepper.inflight:
                self._queued[rank] = True
                heapq.heappush(busy, (clock, rank))
        ended.sort(key=lambda e: (e[0], e[1]))  # stable: a worker's steps stay in order
        for _, rank, end, finished in ended:
            for req in finished:
                self._worker_ended(rank, req, end)

    def _run_behind(self, rank: int, due: float) -> bool:
        """Step worker ``rank``, the busy worker furthest behind, for as long as it stays so
        and its clock is before ``due`` (seconds), stopping after a step that ends requests:
        what follows may move ``due``. True if requests ended."""
        stepper, busy = self.steppers[rank], self._busy
        elapsed, step, after_step = stepper.elapsed, stepper.step, self.news.after_step
        run_decode = stepper.run_decode if self.decode_runs else None
        step_wall = 0.0
        ended = False
        self._queued[rank] = False
        clock = elapsed()
        while True:
            if self.news.backlog > _MAX_BACKLOG:
                self.news.catch_up(clock)
            start = clock
            started = time.perf_counter()
            # Steps run together stop where this loop would: at ``due`` or at the clock of
            # the next busy worker (a tie there is left to the check below).
            run = run_decode(min(due, busy[0][0]) if busy else due) if run_decode else None
            if run is not None:
                step_wall += time.perf_counter() - started
                ends, taken = run
                clock = ends[-1]
                self.news.after_run(rank, start, ends, taken)
                if clock >= due or (busy and busy[0] < (clock, rank)):
                    break
                continue
            _, finished = step()
            step_wall += time.perf_counter() - started
            clock = elapsed()
            after_step(rank, finished, start, clock)
            if finished:
                for req in finished:
                    self._worker_ended(rank, req, clock)
                ended = True
                break
            # The next step of the busy worker furthest behind (the lowest rank on a tie).
            if clock >= due or (busy and busy[0] < (clock, rank)):
                break
        self.step_wall[rank] += step_wall
        if stepper.inflight and not self._queued[rank]:
            self._queued[rank] = True
            heapq.heappush(busy, (clock, rank))
        return ended
