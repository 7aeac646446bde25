"""Costs of the KV-event path, each measured against its baseline in the same run.

(a) Transport: events/s from ``ZmqEventPublisher`` to a decoding ``KvEventSubscriber`` in another
    process, over loopback tcp, against the same batches encoded and sent inline on one PUB
    socket to a plain SUB that decodes them. Target: ratio >= 0.9.
(b) Cache: ``RadixCache`` insert + evict CPU time with events on against events off, on
    512-token sequences sharing 384-token prefixes in 20 groups, page size 16, a pool of 64
    sequences. Method: each round runs events off, events on with the native page chain, events
    on with the pure-Python chain and a recorder that only hashes (native chain, no events built
    or queued), back to back in one process, in an order that rotates every round; each side's
    ratio to the same round's "off" is one paired figure. ``--rounds`` rounds (default 7);
    printed as min / median / max. Targets: events on / off <= 1.35 with the native chain,
    <= 1.8 with the pure-Python chain (medians).
(c) Caller: time a scheduler spends in ``KvEventsPublisher.publish_kv_events()`` (take the
    cache's events, build the batch, ``publish``) per event, with the step's cache work in
    between calls. Target: <= 150 ns per event.

Usage: ``python benchmarks/bench_kv_events.py [--quick]``. Prints each figure, its ratio and
whether the target is met; exits 0 either way.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog
from kv_transport import transport_rate

from schedkit.components.cache import event_recorder
from schedkit.components.cache.event_recorder import EventRecorder
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.io.kv_events_publisher import KvEventsPublisher
from schedkit.components.metrics.reporter import SchedulerStats
from schedkit.kv_events import (
    KVEventBatch,
    KvEventsConfig,
    ZmqEventPublisher,
    page_chain,
)

PAGE_SIZE = 16
SEQ_LEN = 512
PREFIX_LEN = 384
GROUPS = 20
POOL_SEQS = 64  # the KV pool holds this many sequences' worth of tokens
REQS_PER_STEP = 4
WARM_SEQS = 300  # fills the pool, so that every timed insert evicts
TARGETS = {"transport": 0.9, "cache native": 1.35, "cache python": 1.8, "caller_ns": 150.0}


def sequences(n: int, seed: int = 0) -> list[list[int]]:
    """``n`` token sequences: a prefix shared by one of ``GROUPS`` groups, then unique tokens."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(32000) for _ in range(PREFIX_LEN)] for _ in range(GROUPS)]
    return [
        prefixes[i % GROUPS] + [rng.randrange(32000) for _ in range(SEQ_LEN - PREFIX_LEN)]
        for i in range(n)
    ]


class HashOnlyRecorder(EventRecorder):
    """Packs and hashes new nodes' pages as the cache's recorder does, and builds no events."""

    def stored(self, node: Any, raw: bytes) -> None:
        """Keep the page digests on ``node``; queue nothing."""
        node.digests = self.hash_pages(node, raw)
        node.hashes = []

    def removed(self, node: Any) -> None:
        """Queue nothing."""


def new_cache(events: bool | str) -> RadixCache:
    """A radix cache with events off (False), on (True) or only hashing ("hash only")."""
    cache = RadixCache(
        page_size=PAGE_SIZE, capacity=POOL_SEQS * SEQ_LEN, enable_kv_cache_events=bool(events)
    )
    if events == "hash only":
        cache._events = HashOnlyRecorder(PAGE_SIZE)
    cache.take_events()
    return cache


def step_batches(n_steps: int) -> list[KVEventBatch]:
    """The batches a scheduler would publish: one per step of ``REQS_PER_STEP`` inserts."""
    cache = new_cache(True)
    seqs = sequences(n_steps * REQS_PER_STEP, seed=1)
    batches = []
    for step in range(n_steps):
        for seq in seqs[step * REQS_PER_STEP : (step + 1) * REQS_PER_STEP]:
            cache.insert(seq)
        batches.append(KVEventBatch(float(step), cache.take_events(), 0))
    return batches


# -- (b) cache ------------------------------------------------------------------------------


@contextmanager
def python_chain() -> Iterator[None]:
    """Make the caches' recorders pack and hash with the pure-Python page chain meanwhile."""
    saved = event_recorder.chain_packed, event_recorder.chain_ids, event_recorder.pack_u32
    event_recorder.chain_packed = page_chain.chain_packed_py
    event_recorder.chain_ids = page_chain.chain_ids_py
    event_recorder.pack_u32 = None
    try:
        yield
    finally:
        event_recorder.chain_packed, event_recorder.chain_ids, event_recorder.pack_u32 = saved


def cache_seconds(events: bool | str, warm: list[list[int]], seqs: list[list[int]]) -> float:
    """CPU time to insert ``seqs`` into a cache already filled with ``warm`` (so every insert
    evicts), taking the events every step as the publisher would."""
    cache = new_cache(events)
    for seq in warm:
        cache.insert(seq)
    cache.take_events()
    gc.collect()
    start = time.process_time()
    for i, seq in enumerate(seqs):
        cache.insert(seq)
        if i % REQS_PER_STEP == REQS_PER_STEP - 1:
            cache.take_events()
    return time.process_time() - start


CACHE_SIDES = ("off", "on native", "on python", "hashing only")


def cache_side_seconds(side: str, warm: list[list[int]], seqs: list[list[int]]) -> float:
    """One side of (b): see ``CACHE_SIDES``."""
    if side == "off":
        return cache_seconds(False, warm, seqs)
    if side == "on native":
        return cache_seconds(True, warm, seqs)
    if side == "hashing only":
        return cache_seconds("hash only", warm, seqs)
    with python_chain():
        return cache_seconds(True, warm, seqs)


def cache_ratios(rounds: int, warm: list[list[int]], seqs: list[list[int]]) -> dict:
    """Per side, the seconds of every round and its ratio to the same round's "off"."""
    seconds: dict[str, list[float]] = {side: [] for side in CACHE_SIDES}
    for r in range(rounds):
        order = CACHE_SIDES[r % len(CACHE_SIDES) :] + CACHE_SIDES[: r % len(CACHE_SIDES)]
        for side in order:
            seconds[side].append(cache_side_seconds(side, warm, seqs))
    ratios = {
        side: [on / off for on, off in zip(seconds[side], seconds["off"], strict=True)]
        for side in CACHE_SIDES[1:]
    }
    return {"seconds": seconds, "ratios": ratios}


def spread(values: list[float], fmt: str = ".3f") -> str:
    """``min / median / max``."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{low:{fmt}} / {mid:{fmt}} / {high:{fmt}}"


# -- (c) caller -----------------------------------------------------------------------------


class CountingCache:
    """Hands a cache's events on and counts them (the count is part of the timed call, so
    the figure errs high by one attribute update per step)."""

    def __init__(self, cache: RadixCache) -> None:
        self.take = cache.take_events
        self.taken = 0

    def take_events(self) -> list:
        events = self.take()
        self.taken += len(events)
        return events


def caller_ns_per_event(n_steps: int) -> tuple[float, float, float]:
    """Per event: ns in ``ZmqEventPublisher.publish`` and in the component's whole
    ``publish_kv_events``; and events per step. Each step inserts ``REQS_PER_STEP`` sequences
    first. The garbage collector is paused so that a collection the cache's allocations set
    off is not charged to the call that happens to trigger it."""
    seqs = sequences(2 * n_steps * REQS_PER_STEP, seed=2)
    steps = [seqs[i : i + REQS_PER_STEP] for i in range(0, len(seqs), REQS_PER_STEP)]
    clock, config = time.perf_counter_ns, KvEventsConfig(endpoint="tcp://127.0.0.1:0")
    cache, publisher = new_cache(True), ZmqEventPublisher(config)
    component_cache = new_cache(True)
    counting = CountingCache(component_cache)
    component = KvEventsPublisher(
        kv_events_config=config,
        tree_cache=counting,
        max_running_requests=256,
        max_total_num_tokens=POOL_SEQS * SEQ_LEN,
        page_size=PAGE_SIZE,
        get_stats=SchedulerStats,
    )
    publish_ns = component_ns = events = 0
    gc.disable()
    try:
        for step in steps[:n_steps]:
            for seq in step:
                cache.insert(seq)
            batch = KVEventBatch(time.time(), cache.take_events(), 0)
            events += len(batch.events)
            start = clock()
            publisher.publish(batch)
            publish_ns += clock() - start
        for step in steps[n_steps:]:
            for seq in step:
                component_cache.insert(seq)
            start = clock()
            component.publish_kv_events()
            component_ns += clock() - start
    finally:
        gc.enable()
        publisher.shutdown()
        component.shutdown()
    return publish_ns / events, component_ns / counting.taken, events / n_steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (a few seconds)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of (b), >= 5 (7; quick 5)")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    rounds = 1 if args.quick else 3
    if args.rounds is None:
        args.rounds = 5 if args.quick else 7
    if args.rounds < 5:
        parser.error("--rounds must be >= 5 (min / median / max over at least five pairs)")
    n_steps = 200 if args.quick else 2000
    n_seqs = 400 if args.quick else 3000

    batches = step_batches(n_steps)
    n_events = sum(len(b.events) for b in batches)
    print(f"(a) transport: {len(batches)} batches, {n_events / len(batches):.1f} events each")
    pub_rate = max(transport_rate("subscriber", batches) for _ in range(rounds))
    raw_rate = max(transport_rate("raw", batches) for _ in range(rounds))
    ratio_a = pub_rate / raw_rate
    print(f"    publisher -> KvEventSubscriber: {pub_rate:12,.0f} events/s")
    print(f"    inline PUB -> SUB + decode:     {raw_rate:12,.0f} events/s")
    met = "met" if ratio_a >= TARGETS["transport"] else "NOT met"
    print(f"    ratio a (publisher / inline) = {ratio_a:.3f}  target >= 0.9: {met}")

    seqs = sequences(n_seqs + WARM_SEQS)
    warm, seqs = seqs[:WARM_SEQS], seqs[WARM_SEQS:]
    result = cache_ratios(args.rounds, warm, seqs)
    chain = page_chain.implementation()
    print(f"(b) cache: {n_seqs} inserts of {SEQ_LEN} tokens into a full pool, page {PAGE_SIZE}")
    print(f"    CPU time, {args.rounds} interleaved rounds, min / median / max; chain: {chain}")
    for side in CACHE_SIDES:
        per_insert = [t / n_seqs * 1e6 for t in result["seconds"][side]]
        print(f"    {side + ':':14} {spread(per_insert, '.1f')} us per insert")
    for side, target in (("on native", "cache native"), ("on python", "cache python")):
        ratios = result["ratios"][side]
        met = "met" if statistics.median(ratios) <= TARGETS[target] else "NOT met"
        label = f"ratio b ({side} / off)"
        print(f"    {label:26} = {spread(ratios)}  target <= {TARGETS[target]}: {met}")
    print(f"    {'hashing only / off':26} = {spread(result['ratios']['hashing only'])}")

    ns, whole, per_step = min(caller_ns_per_event(n_steps) for _ in range(rounds))
    ratio_c = ns / TARGETS["caller_ns"]
    print(f"(c) caller: {n_steps} steps of {REQS_PER_STEP} inserts, {per_step:.1f} events each")
    print(
        f"    publish():           {ns:7.1f} ns per event ({ns * per_step / 1000:.2f} us per step)"
    )
    print(f"    publish_kv_events(): {whole:7.1f} ns per event (take + batch + publish)")
    met = "met" if ns <= TARGETS["caller_ns"] else "NOT met"
    print(f"    ratio c (cost / 150 ns target) = {ratio_c:.3f}  target <= 1.0: {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
