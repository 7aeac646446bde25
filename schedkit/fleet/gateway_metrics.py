"""The fleet front end's ``/metrics``: router-level figures in Prometheus' text format, served on
a free loopback port that the HTTP front end relays.

They are what the router sees, not the workers' own engine metrics (each worker's are on its
own ``/metrics`` with ``--worker-http``): requests routed to each worker and how they ended,
the prompt, cached and generated tokens of the requests each worker finished (counters, always
current), and, as of the last load query (every 0.5 s), requests in flight on each worker
(before and after their first token), the router queue and each worker's blocks in the
router's KV index (gauges).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["FleetFigures", "GatewayMetrics"]

PREFIX = "schedkit_fleet"


class FleetFigures(Protocol):
    """What the metrics read of the fleet front end (plain numbers and lists)."""

    alive: list[bool]
    routed: list[int]
    outcomes: dict[str, list[int]]
    router_outcomes: dict[str, int]
    prompt_tokens: list[int]
    cached_tokens: list[int]
    generated_tokens: list[int]
    indexed_blocks: list[int]

    def in_flight(self) -> tuple[list[int], list[int], int]:
        """Per worker, requests with no first token and with one; requests at the router."""


class _FleetCollector(Collector):
    def __init__(self, fleet: FleetFigures) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        fleet = self.fleet
        workers = [str(rank) for rank in range(len(fleet.alive))]
        up = GaugeMetricFamily(
            f"{PREFIX}_worker_up", "1 while the worker is routed to", labels=["worker"]
        )
        for name, alive in zip(workers, fleet.alive, strict=True):
            up.add_metric([name], 1.0 if alive else 0.0)
        yield up
        waiting, running, queued = fleet.in_flight()  # as of the same moment as indexed_blocks
        for metric, doc, values in (
            ("requests_waiting", "requests on the worker with no first token yet", waiting),
            ("requests_running", "requests on the worker generating", running),
            (
                "indexed_blocks",
                "KV blocks of the worker in the router's index",
                fleet.indexed_blocks,
            ),
        ):
            gauge = GaugeMetricFamily(f"{PREFIX}_{metric}", doc, labels=["worker"])
            for name, value in zip(workers, values, strict=True):
                gauge.add_metric([name], value)
            yield gauge
        yield GaugeMetricFamily(
            f"{PREFIX}_router_queue_requests", "requests waiting at the router", value=queued
        )
        for metric, doc, values in (
            ("requests_routed", "requests sent to the worker", fleet.routed),
            ("prompt_tokens", "prompt tokens of requests the worker finished", fleet.prompt_tokens),
            ("cached_tokens", "of those, tokens served from its prefix cache", fleet.cached_tokens),
            ("generation_tokens", "tokens the worker generated", fleet.generated_tokens),
        ):
            counter = CounterMetricFamily(f"{PREFIX}_{metric}", doc, labels=["worker"])
            for name, value in zip(workers, values, strict=True):
                counter.add_metric([name], value)
            yield counter
        ended = CounterMetricFamily(
            f"{PREFIX}_requests_ended",
            "requests ended, by where (a worker, or the router) and outcome",
            labels=["worker", "outcome"],
        )
        for outcome, values in fleet.outcomes.items():
            for name, value in zip(workers, values, strict=True):
                ended.add_metric([name, outcome], value)
        for outcome, value in fleet.router_outcomes.items():
            ended.add_metric(["router", outcome], value)
        yield ended


class GatewayMetrics:
    """A Prometheus endpoint on 127.0.0.1 (``port``; 0 picks a free one) over ``fleet``'s
    figures, in a registry of its own; ``close()`` stops it."""

    def __init__(self, fleet: FleetFigures, port: int = 0) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_FleetCollector(fleet))
        self._server, self._thread = start_http_server(
            port, addr="127.0.0.1", registry=self.registry
        )
        self.port: int = self._server.server_address[1]

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
