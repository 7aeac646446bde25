"""observe_many against prometheus_client's own observe, sample by sample."""

import math
import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from schedkit.components.metrics.observe_many import observe_many
from schedkit.components.metrics.profiles import PROFILES

BUCKETS = PROFILES["sglang"].itl.buckets


def _histogram(labels: bool) -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    names = ("model_name",) if labels else ()
    metric = Histogram("itl_seconds", "gaps", names, registry=registry, buckets=BUCKETS)
    return registry, (metric.labels("m") if labels else metric)


def _exposition(registry: CollectorRegistry) -> list[bytes]:
    return [line for line in generate_latest(registry).splitlines() if b"_created" not in line]


def test_the_exposition_is_that_of_observing_each_sample():
    rng = random.Random(7)
    edges = [b for b in BUCKETS if math.isfinite(b)]
    for labels in (False, True):
        for size in (0, 1, 2, 64, 500):
            samples = [
                rng.choice([rng.uniform(0, 2 * edges[-1]), rng.choice(edges)]) for _ in range(size)
            ]
            samples += [1e9, 0.0][: min(size, 2)]
            one, each = _histogram(labels)
            many, batch = _histogram(labels)
            for sample in samples:
                each.observe(sample)
            observe_many(batch, samples)
            assert _exposition(one) == _exposition(many)


def test_a_histogram_without_bucket_values_is_observed_sample_by_sample():
    seen = []

    class Observer:
        def observe(self, value: float) -> None:
            seen.append(value)

    observe_many(Observer(), [0.1, 0.2, 0.3])
    assert seen == [0.1, 0.2, 0.3]
