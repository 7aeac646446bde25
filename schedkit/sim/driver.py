"""Drives an assembled scheduler through a workload and summarises what happened.

Arrivals are submitted when the scheduler's clock (the model runner's ``now()``) reaches their
time; when nothing can run, the clock waits for the next arrival (a virtual clock jumps, a wall
clock sleeps). Latencies are measured on that clock: simulated seconds with ``clock: virtual``.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import time
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import sub

from schedkit.assembly.container import Assembly
from schedkit.core.schedule_batch import Req
from schedkit.sim.run_summary import RunSummary, peak_rss_mb, summarize
from schedkit.workloads.arrivals import PendingArrivals
from schedkit.workloads.samples import Tally
from schedkit.workloads.workload import Workload

__all__ = [
    "RunSummary",
    "Stepper",
    "StuckError",
    "Tally",
    "drive",
    "peak_rss_mb",
    "summarize",
]

# Steps in a row that run nothing while requests are in flight.
_MAX_IDLE_STEPS = 1000
# The most decode steps ``Stepper.run_decode`` runs at once.
DECODE_RUN_STEPS = 1024


class StuckError(RuntimeError):
    """The scheduler stopped making progress with requests still in flight."""


class Stepper:
    """One assembly's side of a run: requests submitted at their arrival time on the
    assembly's clock (seconds from ``start``), the scheduler stepped, and the requests that
    finish handed back (their numbers go to ``tally``; ``on_finish(req)`` sees each first).

    The scheduler reports each request that finishes through its ``on_finish``, which the
    stepper chains onto until ``close()``; so a step costs the same however many requests
    are in flight. Each step also samples the running and queued requests into
    ``tally.timeline``.
    """

    def __init__(
        self,
        assembly: Assembly,
        on_finish: Callable[[Req], None] | None = None,
        tally: Tally | None = None,
    ) -> None:
        self.assembly = assembly
        self.scheduler = assembly["scheduler"]
        self.runner = assembly["model_runner"]
        self.on_finish = on_finish
        self.start = self.runner.now()
        self.inflight: dict[str, int] = {}  # rid -> submission number
        self.tally = Tally() if tally is None else tally
        self.idle_steps = 0
        self._submitted = itertools.count()
        self._finished: list[Req] = []
        self._scheduler_on_finish = self.scheduler.on_finish
        self.scheduler.on_finish = self._collect
        # What counts a run of decode steps at once (see ``run_decode``), if anything does.
        reporter = None
        if "metrics_reporter" in assembly:
            reporter = assembly["metrics_reporter"]
        self._counter = (
            reporter
            if hasattr(reporter, "advance_decode_run")
            and hasattr(reporter, "decode_steps_to_report")
            and hasattr(self.scheduler, "run_decode_steps")
            else None
        )

    def _collect(self, req: Req) -> None:
        self._scheduler_on_finish(req)
        self._finished.append(req)

    def close(self) -> None:
        """Give the scheduler back the ``on_finish`` it had."""
        self.scheduler.on_finish = self._scheduler_on_finish

    def elapsed(self) -> float:
        """Seconds since the start on the assembly's clock."""
        return self.runner.now() - self.start

    def submit(self, at: float, req: Req) -> None:
        """Hand ``req``, arriving ``at`` seconds from the start, to the scheduler;
        ValueError when a request with its rid is still in flight."""
        if req.rid in self.inflight:
            raise ValueError(
                f"rid {req.rid!r} is already in flight; a workload's rids must be unique"
            )
        req.arrival_time = self.start + at
        self.inflight[req.rid] = next(self._submitted)
        self.scheduler.submit(req)

    def wait_until(self, at: float) -> None:
        """Let the clock reach ``at`` seconds from the start with nothing running."""
        self.runner.wait_until(self.start + at)

    def step(self) -> tuple[bool, list[Req]]:
        """One scheduler step: whether a batch ran, and the requests that finished (in the
        order they were submitted, so that what follows them does not depend on the order
        they finished within the step).

        StuckError when requests are in flight and nothing ran for ``_MAX_IDLE_STEPS`` steps
        in a row."""
        scheduler = self.scheduler
        ran = scheduler.step()
        self.tally.timeline.add(
            self.elapsed(), len(scheduler.running_batch.reqs), len(scheduler.waiting_queue)
        )
        finished: list[Req] = []
        if self._finished:
            inflight = self.inflight
            finished = [r for r in self._finished if r.rid in inflight]
            self._finished = []
            finished.sort(key=lambda r: inflight[r.rid])
            for req in finished:
                del inflight[req.rid]
                if self.on_finish is not None:  # first: a Ctrl-C between the two loses no record
                    self.on_finish(req)
                self.tally.add(req)
        if ran or not self.inflight:
            self.idle_steps = 0
        else:
            self.idle_steps += 1
            if self.idle_steps > _MAX_IDLE_STEPS:
                raise StuckError(
                    f"{len(self.inflight)} requests in flight but the scheduler ran nothing "
                    f"for {_MAX_IDLE_STEPS} steps (paused: {scheduler.paused})"
                )
        return ran, finished

    def run_decode(
        self, until: float, max_steps: int = DECODE_RUN_STEPS
    ) -> tuple[list[float], list[tuple[int, int]]] | None:
        """Up to ``max_steps`` steps at once while the scheduler would only run its
        unchanging decode batch, each starting before ``until`` seconds from the start
        (``Scheduler.run_decode_steps``), sampled into ``tally.timeline`` as ``step`` does:
        each step's end (seconds from the start) and the steps that took new KV pages with
        the slots each took. None, with nothing run, when the scheduler, its model runner or
        its metrics reporter cannot, or when requests finished outside a step (refused when
        submitted): ``step`` runs the next step and hands them back at its end."""
        if self._counter is None or self._finished:
            return None
        scheduler = self.scheduler
        run = scheduler.run_decode_steps(max_steps, until, self.start, self._counter)
        if run is None:
            return None
        times, taken = run
        start = self.start
        ends = list(map(sub, times, repeat(start)))  # elapsed(): the same subtraction
        self.tally.timeline.add_run(
            ends, len(scheduler.running_batch.reqs), len(scheduler.waiting_queue)
        )
        self.idle_steps = 0
        return ends, taken

    def summary(self, wall: float, interrupted: bool = False) -> RunSummary:
        """The run's figures so far (``wall``: the wall seconds it took)."""
        return summarize(self.assembly, self.tally, self.elapsed(), wall, interrupted)


def drive(
    assembly: Assembly,
    workload: Workload,
    progress: Callable[[int, float], None] | None = None,
    on_finish: Callable[[Req], None] | None = None,
    samples: Tally | None = None,
) -> RunSummary:
    """Run ``workload`` to completion (or until Ctrl-C: ``interrupted`` in the summary) on
    ``assembly`` and summarise it.

    Arrivals are pulled from the workload as the clock reaches them, and a finished request
    leaves only a few numbers behind (``on_finish(req)`` sees it first), so memory does not
    grow with the number of requests. ``progress(finished, simulated_seconds)`` is called
    after steps that finish requests. The per-request figures and the timeline of running and
    queued requests (sampled each step, bounded) go to ``samples`` (a new ``Tally`` if None),
    where a caller can read them after the run (``--plot`` does).
    """
    stepper = Stepper(assembly, on_finish, samples)
    pending = PendingArrivals(workload)
    wall_start = time.perf_counter()
    interrupted = False

    with _ctrl_c_sets_a_flag() as ctrl_c:
        try:
            while (pending or stepper.inflight) and not ctrl_c:
                for arrival in pending.due(stepper.elapsed()):
                    stepper.submit(arrival.time, arrival.req)
                ran, finished = stepper.step()
                if finished:
                    for req in finished:
                        pending.finished(req, stepper.elapsed())
                    if progress is not None:
                        progress(stepper.tally.done + stepper.tally.failed, stepper.elapsed())
                if not ran and pending:
                    stepper.wait_until(pending.next_time())
        except KeyboardInterrupt:
            interrupted = True
        finally:
            stepper.close()
        interrupted = interrupted or bool(ctrl_c)

    if "kv_events_publisher" in assembly:  # what the cache still holds goes out too
        assembly["kv_events_publisher"].publish_kv_events()
    return stepper.summary(time.perf_counter() - wall_start, interrupted)


@contextlib.contextmanager
def _ctrl_c_sets_a_flag() -> Iterator[list[int]]:
    """While the run lasts, Ctrl-C (SIGINT) is also recorded in the list yielded, so the loop
    stops even when the KeyboardInterrupt is lost: raised inside a finalizer that a garbage
    collection runs, Python prints it and drops it. Off the main thread (where no handler can
    be set), or when SIGINT is ignored (as Python leaves it when started so), nothing changes
    and the list stays empty."""
    flag: list[int] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
        yield flag
        return

    def record(signum: int, frame: object) -> None:
        flag.append(signum)
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, record)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
