"""Where the metrics reporter's stats go: ``SchedulerStats`` (the current figures), logged with
structlog and, with metrics enabled, kept in Prometheus metrics named as SGLang or vLLM name
them (``metrics_profiles``), served over HTTP when a port is given."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, Literal

import msgspec
import structlog

from schedkit.components.metrics.observe_many import observe_many
from schedkit.components.metrics.profiles import PROFILES, Histogram
from schedkit.core.schedule_batch import FinishReason, Req

__all__ = ["FINISH_REASONS", "MetricsCollector", "SchedulerStats", "finish_reason_name"]

FINISH_REASONS = ("stop", "length", "abort")


class SchedulerStats(msgspec.Struct):
    """The scheduler's current stats (what the metrics collector logs and exports).

    ``cache_hit_rate`` is cumulative since start: prompt tokens served from the prefix cache /
    (those + computed prompt tokens) over every prefill batch; a chunked request's own earlier
    chunks are not hits for its later ones (``ScheduleBatch.cache_hit_lens``). The two queue
    figures are zeroed while the scheduler idles.
    """

    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    num_used_tokens: int = 0
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    input_throughput: float = 0.0
    cache_hit_rate: float = 0.0
    # The hit rate split by tier: hits on the device, and hits loaded back from host memory.
    cache_hit_rate_device: float = 0.0
    cache_hit_rate_host: float = 0.0
    # Mean queue time (left the queue - entered it) of the last prefill batch's requests.
    avg_request_queue_latency: float = 0.0
    # Mean time the requests waiting now have waited so far.
    queue_wait_time: float = 0.0


class MetricsCollector:
    """Logs stats with structlog (console or JSON lines on stderr) and, with ``export``, keeps
    them in Prometheus metrics named as ``profile`` says (``metrics_profiles``): gauges, token
    counters, and per-request histograms and counters (``observe_finished``).

    The metrics live in ``registry``, a ``CollectorRegistry`` of this collector's own (never
    the process-wide one), so several schedulers in one process do not clash; it is served
    over HTTP on 127.0.0.1 when a port is given. ``label_values`` are the values of the
    profile's labels (model name, and the engine index under ``vllm``).
    ``last_log_time`` is the ``now()`` of the last ``log_stats``; ``prometheus_port`` is the
    port actually bound (useful with port 0).
    """

    def __init__(
        self,
        *,
        now: Callable[[], float],
        log_format: Literal["console", "json"] = "console",
        export: bool = False,
        prometheus_port: int | None = None,
        profile: str = "sglang",
        label_values: tuple[str, ...] = ("default",),
    ) -> None:
        self.now = now
        self.last_log_time = now()
        renderer = (
            structlog.processors.JSONRenderer()
            if log_format == "json"
            else structlog.dev.ConsoleRenderer(colors=False)
        )
        self.logger = structlog.wrap_logger(
            structlog.PrintLogger(file=sys.stderr),
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                renderer,
            ],
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        ).bind(logger="schedkit.metrics")
        self.prometheus_port: int | None = None
        self.registry: Any = None
        self._gauges: dict[str, Any] = {}
        self._server = self._thread = None
        if profile not in PROFILES:
            raise ValueError(
                f"metrics profile must be one of {', '.join(map(repr, PROFILES))}, got {profile!r}"
            )
        self.profile = PROFILES[profile]
        if len(label_values) != len(self.profile.labels):
            raise ValueError(
                f"the {profile} profile labels metrics with {', '.join(self.profile.labels)}; "
                f"got {len(label_values)} value(s) {label_values!r}"
            )
        if export or prometheus_port is not None:
            self._register(tuple(map(str, label_values)))
        if prometheus_port is not None:
            self._serve(prometheus_port)

    def _register(self, values: tuple[str, ...]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge
        from prometheus_client import Histogram as PromHistogram

        profile, registry = self.profile, CollectorRegistry()
        self.registry = registry
        names = profile.labels

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, names, registry=registry).labels(*values)

        def histogram(spec: Histogram | None) -> Any:
            if spec is None:
                return None
            metric = PromHistogram(
                spec.name, spec.doc, names, registry=registry, buckets=spec.buckets
            )
            return metric.labels(*values)

        for field, (name, doc) in profile.gauges.items():
            self._gauges[field] = Gauge(name, doc, names, registry=registry).labels(*values)
        self._ttft, self._itl = histogram(profile.ttft), histogram(profile.itl)
        self._e2e, self._queue = histogram(profile.e2e), histogram(profile.queue_time)
        self._tpot = histogram(profile.tpot)
        self._prompt = counter(profile.prompt_tokens, "Number of prefill tokens processed.")
        self._generation = counter(
            profile.generation_tokens, "Number of generation tokens processed."
        )
        self._cached = counter(profile.cached_tokens, "Number of cached prompt tokens.")
        self._aborted = None
        if profile.aborted_requests is None:  # one counter labelled by finish reason
            success = Counter(
                profile.requests,
                "Count of successfully processed requests.",
                (*names, "finished_reason"),
                registry=registry,
            )
            self._requests = {r: success.labels(*values, r) for r in FINISH_REASONS}
        else:
            total = counter(profile.requests, "Number of requests processed.")
            self._requests = dict.fromkeys(FINISH_REASONS, total)
            self._aborted = counter(profile.aborted_requests, "Number of requests aborted.")
        self._batch_tokens: tuple[Any, Any, Any] | None = None
        if profile.realtime_tokens is not None:
            realtime = Counter(
                profile.realtime_tokens,
                "Total number of tokens processed (updated on each log interval). "
                "mode: prefill_compute, prefill_cache, decode.",
                (*names, "mode"),
                registry=registry,
            )
            self._batch_tokens = tuple(
                realtime.labels(*values, mode)
                for mode in ("prefill_compute", "prefill_cache", "decode")
            )
        if profile.prefix_cache_queries is not None:
            self._cache_queries = counter(
                profile.prefix_cache_queries,
                "Prefix cache queries, in terms of number of queried tokens.",
            )
            self._cache_hits = counter(
                profile.prefix_cache_hits,
                "Prefix cache hits, in terms of number of cached tokens.",
            )

    def _serve(self, port: int) -> None:
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(
                port, addr="127.0.0.1", registry=self.registry
            )
        except OSError as exc:
            raise ValueError(
                f"cannot serve Prometheus metrics on 127.0.0.1:{port}: {exc}"
            ) from None
        self.prometheus_port = self._server.server_address[1]

    def log_stats(self, stats: SchedulerStats) -> None:
        """Export ``stats`` and restart the idle-log clock."""
        self.last_log_time = self.now()
        self.export(stats)

    @property
    def exports(self) -> bool:
        """True when the stats go to Prometheus metrics."""
        return self.registry is not None

    def export(self, stats: SchedulerStats) -> None:
        """Set the Prometheus gauges from ``stats`` (nothing without Prometheus)."""
        for name, gauge in self._gauges.items():
            gauge.set(getattr(stats, name))

    def count_tokens(self, *, prompt: int = 0, cached: int = 0, generated: int = 0) -> None:
        """Count the tokens of a batch: computed prompt tokens, prompt tokens found in the
        prefix cache, generated tokens (nothing without Prometheus)."""
        if self.registry is None:
            return
        if self._batch_tokens is not None:
            compute, cache, decode = self._batch_tokens
            compute.inc(prompt)
            cache.inc(cached)
            decode.inc(generated)
        else:
            self._cache_queries.inc(prompt + cached)
            self._cache_hits.inc(cached)

    def observe_finished(self, req: Req) -> None:
        """Count a finished request and observe its latencies (nothing without Prometheus):
        time to first token, each inter-token latency, end to end, time in the waiting queue
        (arrival to first admission) and, under ``vllm``, time per output token after the
        first."""
        if self.registry is None:
            return
        arrival, first, finish = req.arrival_time, req.first_token_time, req.finish_time
        if first is not None:
            self._ttft.observe(first - arrival)
        observe_many(self._itl, req.itl)
        if finish is not None:
            self._e2e.observe(finish - arrival)
        if req.scheduled_time is not None:
            self._queue.observe(req.scheduled_time - arrival)
        generated = len(req.output_ids)
        if self._tpot is not None and generated > 1 and first is not None and finish is not None:
            self._tpot.observe((finish - first) / (generated - 1))
        self._prompt.inc(len(req.origin_input_ids))
        self._generation.inc(generated)
        if req.cached_tokens > 0:
            self._cached.inc(req.cached_tokens)
        reason = finish_reason_name(req.finished_reason)
        self._requests[reason].inc()
        if reason == "abort" and self._aborted is not None:
            self._aborted.inc()

    def shutdown(self) -> None:
        """Stop the Prometheus HTTP server, if one runs."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = self._thread = None


def finish_reason_name(reason: FinishReason | None) -> str:
    """``stop``, ``length`` or ``abort``: the finish reason as SGLang and vLLM name it."""
    return "abort" if reason is None else type(reason).__struct_config__.tag
