"""A fleet of N schedulers behind a router, in one process on one virtual timeline.

Each worker is a whole assembly built from the wiring, as DP rank ``r`` of ``N``; its KV
events go out through the ``queue`` publisher (``schedkit.fleet.events``), encoded as on the
wire, and the router decodes them into its ``KvIndex``. Time moves as a discrete-event
simulation over the workers' virtual clocks: the busy worker furthest behind steps next, and
an arrival is routed once every busy worker's clock has reached it (idle workers' clocks
jump there), so the router sees every event published up to then (and, from a busy worker
whose last step ended after the arrival, those of that step too). The same wiring, workload
and seed give the same numbers. The wiring's model runner should run on the virtual clock
(the default); on the wall clock every step would also take its time.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from schedkit.assembly.container import Assembly, build
from schedkit.assembly.loading import load_wiring
from schedkit.assembly.wiring import Wiring, WiringError
from schedkit.fleet.events import attach
from schedkit.fleet.summary import FleetSummary, fleet_summary
from schedkit.kv_events import KvEventsConfig
from schedkit.kv_events.structs import get_profile
from schedkit.router import Router, make_policy
from schedkit.sim.driver import Stepper, peak_rss_mb
from schedkit.workloads.arrivals import PendingArrivals
from schedkit.workloads.workload import Workload

__all__ = ["OfflineFleet", "kv_events_config", "run_offline", "worker_wiring"]

_runs = itertools.count()


def kv_events_config(wiring: Wiring) -> tuple[str, KvEventsConfig] | None:
    """The component publishing KV events and its config, or None when events are off."""
    for name, spec in wiring.components.items():
        config = spec.args.get("kv_events_config")
        if isinstance(config, KvEventsConfig):
            return name, config
    return None


def worker_wiring(
    file: str | os.PathLike,
    overlays: Sequence[str | os.PathLike | dict],
    rank: int,
    num_workers: int,
    kv_events: dict | None = None,
) -> Wiring:
    """The wiring of worker ``rank``: the file and overlays as DP rank ``rank`` of
    ``num_workers``, with ``kv_events`` (keys of ``KvEventsConfig``) over its KV-event
    config."""
    rank_overlay = {
        "components": {
            "parallel_state": {"args": {"dp_size": num_workers, "dp_rank": rank}},
        }
    }
    wiring = load_wiring(file, *overlays, rank_overlay)
    found = kv_events_config(wiring)
    if kv_events is None or found is None:
        return wiring
    name, config = found
    merged = {**msgspec.structs.asdict(config), **kv_events}
    events_overlay = {"components": {name: {"args": {"kv_events_config": merged}}}}
    return load_wiring(file, *overlays, rank_overlay, events_overlay)


def run_offline(
    file: str | os.PathLike,
    workload: Workload,
    num_workers: int,
    policy: str = "kv",
    *,
    overlays: Sequence[str | os.PathLike | dict] = (),
    settings: Mapping[str, float] | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> FleetSummary:
    """Route ``workload`` over ``num_workers`` schedulers built from ``file`` (+ overlays)
    with the routing ``policy`` (and its ``settings``, see ``make_policy``) and summarise the
    run (see the module docstring)."""
    if num_workers < 1:
        raise ValueError(f"a fleet needs at least one worker, got {num_workers}")
    settings = dict(settings or {})
    # A bad name or setting fails before anything is built.
    uses_prefix = make_policy(policy, **settings).uses_prefix
    endpoint = f"inproc://schedkit-fleet-{os.getpid()}-{next(_runs)}"
    wirings = [
        worker_wiring(
            file,
            overlays,
            rank,
            num_workers,
            {"publisher": "queue", "endpoint": endpoint, "replay_endpoint": None},
        )
        for rank in range(num_workers)
    ]
    found = kv_events_config(wirings[0])
    if found is None and uses_prefix:
        raise WiringError(
            f"{Path(file)}: routing by prefix needs the workers' KV events; give the "
            "kv_events_publisher a kv_events_config"
        )
    with contextlib.ExitStack() as stack:
        started = time.perf_counter()
        assemblies = [stack.enter_context(build(w)) for w in wirings]
        setup = time.perf_counter() - started
        summary = OfflineFleet(assemblies, workload, policy, found, progress, settings).run()
        summary.setup_seconds = setup
        return summary


class OfflineFleet:
    """The discrete-event loop of one offline fleet run over built ``assemblies`` (worker
    ``r`` is DP rank ``r``). ``events``: the KV-event component's name and config (None when
    events are off); the router's ``KvIndex`` is fed from each worker's queue publisher."""

    def __init__(
        self,
        assemblies: Sequence[Assembly],
        workload: Workload,
        policy: str,
        events: tuple[str, KvEventsConfig] | None,
        progress: Callable[[int, float], None] | None = None,
        settings: Mapping[str, float] | None = None,
    ) -> None:
        self.assemblies = assemblies
        self.workload = workload
        self.policy = policy
        self.progress = progress
        self.steppers = [Stepper(a) for a in assemblies]
        self.routed = [0] * len(assemblies)
        self.step_wall = [0.0] * len(assemblies)
        self.channels = []
        page_size = 1
        if events is not None:
            name, config = events
            publishers = [a[name] for a in assemblies]
            self.channels = [attach(p.endpoint) for p in publishers]
            self.decode = get_profile(config.profile).decode
            page_size = publishers[0].page_size
        steppers = self.steppers
        self.router = Router(
            range(len(assemblies)),
            page_size,
            make_policy(policy, **(settings or {})),
            lambda rank: len(steppers[rank].inflight),
        )

    def _take_events(self, rank: int) -> None:
        apply, decode = self.router.index.apply, self.decode
        for _, payload in self.channels[rank].take():
            apply(decode(payload), rank)

    def run(self) -> FleetSummary:
        """Run the workload to the end (or Ctrl-C) and summarise it."""
        steppers = self.steppers
        pending = PendingArrivals(self.workload)
        wall_start = time.perf_counter()
        finished_count, interrupted = 0, False
        try:
            while True:
                due = pending.next_time()
                busy = [s for s in steppers if s.inflight]
                behind = min(busy, key=Stepper.elapsed, default=None)
                if behind is None and due == math.inf:
                    break
                if behind is not None and behind.elapsed() < due:
                    rank = steppers.index(behind)
                    started = time.perf_counter()
                    _, finished = behind.step()
                    self.step_wall[rank] += time.perf_counter() - started
                    if self.channels:
                        self._take_events(rank)
                    for req in finished:
                        pending.finished(req, behind.elapsed())
                    if finished and self.progress is not None:
                        finished_count += len(finished)
                        self.progress(finished_count, behind.elapsed())
                    continue
                arrival = pending.pop()
                for stepper in steppers:
                    if not stepper.inflight:
                        stepper.wait_until(due)
                rank = self.router.route(arrival.req.origin_input_ids).rank
                self.routed[rank] += 1
                steppers[rank].submit(due, arrival.req)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            for stepper in steppers:
                stepper.close()
        return self._summary(time.perf_counter() - wall_start, interrupted)

    def _summary(self, wall: float, interrupted: bool) -> FleetSummary:
        tokens = []
        for assembly in self.assemblies:
            scheduler = assembly["scheduler"]
            tokens.append((scheduler.prefill_tokens_cached, scheduler.prefill_tokens_computed))
        n = len(self.steppers)
        return fleet_summary(
            policy=self.policy,
            mode="offline",
            tallies=[s.tally for s in self.steppers],
            routed=self.routed,
            tokens=tokens,
            walls=self.step_wall,
            rss=[peak_rss_mb()] * n,  # one process: every worker's figure is the fleet's
            alive=[True] * n,
            simulated_seconds=max(s.elapsed() for s in self.steppers),
            wall_seconds=wall,
            interrupted=interrupted,
        )
