"""Prometheus metric names, label names and histogram buckets, as SGLang and vLLM export them.

Two profiles: ``sglang`` (``sglang/srt/metrics/collector.py``: ``SchedulerMetricsCollector``
for the gauges, queue time and realtime token counter, ``TokenizerMetricsCollector`` for the
per-request histograms and counters) and ``vllm`` (``vllm/v1/metrics/loggers.py``,
``PrometheusStatLogger``, 0.11 names: ``inter_token_latency_seconds`` and
``request_time_per_output_token_seconds``). A dashboard or router written for either engine
reads ours unchanged.

``gauges`` maps a ``SchedulerStats`` field to the metric that exports it; a field an engine
has no metric for is left out of that profile, except ``input_throughput`` under ``sglang``,
which SGLang logs but does not export and schedkit exports as ``sglang:input_throughput``.
"""

from __future__ import annotations

import attrs

__all__ = ["PROFILES", "Histogram", "MetricsProfile"]


@attrs.frozen
class Histogram:
    """One histogram: its name, help text and upper bucket bounds (``+Inf`` is implied)."""

    name: str
    doc: str
    buckets: tuple[float, ...]


@attrs.frozen(kw_only=True)
class MetricsProfile:
    """The metric names of one engine. Counters are named as declared; the exposition adds
    ``_total`` where the name lacks it (``vllm:prompt_tokens`` -> ``vllm:prompt_tokens_total``).

    ``requests`` counts finished requests: under ``sglang`` all of them in ``requests`` and the
    aborted ones again in ``aborted_requests``; under ``vllm`` one counter labelled
    ``finished_reason`` (``stop``, ``length``, ``abort``), and ``aborted_requests`` is None.
    Tokens are also counted as batches run: SGLang's ``realtime_tokens`` (labelled ``mode``:
    ``prefill_compute``, ``prefill_cache``, ``decode``), or vLLM's ``prefix_cache_queries``
    (prompt tokens looked up) and ``prefix_cache_hits`` (those found in the cache).
    """

    labels: tuple[str, ...]
    gauges: dict[str, tuple[str, str]]
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    queue_time: Histogram
    tpot: Histogram | None
    prompt_tokens: str
    generation_tokens: str
    cached_tokens: str
    requests: str
    aborted_requests: str | None
    realtime_tokens: str | None = None
    prefix_cache_queries: str | None = None
    prefix_cache_hits: str | None = None


# SGLang's TokenizerMetricsCollector defaults.
_SGLANG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
_SGLANG_E2E = (*_SGLANG_TTFT, 600, 1200, 1800, 2400)
_SGLANG_ITL = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
# SGLang's SchedulerMetricsCollector.queue_time.
_SGLANG_QUEUE = (
    0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300,
    400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000,
)  # fmt: skip

# vLLM's PrometheusStatLogger.
_VLLM_TTFT = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_VLLM_ITL = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
_VLLM_REQUEST_LATENCY = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

PROFILES: dict[str, MetricsProfile] = {
    "sglang": MetricsProfile(
        labels=("model_name",),
        gauges={
            "num_running_reqs": ("sglang:num_running_reqs", "The number of running requests."),
            "num_queue_reqs": (
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
            ),
            "num_used_tokens": ("sglang:num_used_tokens", "The number of used tokens."),
            "token_usage": ("sglang:token_usage", "The token usage."),
            "gen_throughput": ("sglang:gen_throughput", "The generation throughput (token/s)."),
            "input_throughput": (
                "sglang:input_throughput",
                "Prompt tokens computed per second at the last prefill batch (schedkit's own).",
            ),
            "cache_hit_rate": ("sglang:cache_hit_rate", "The prefix cache hit rate."),
            "avg_request_queue_latency": (
                "sglang:avg_request_queue_latency",
                "The average request queue latency for the last batch of requests in seconds.",
            ),
            "queue_wait_time": (
                "sglang:queue_wait_time_seconds",
                "Mean time the waiting requests have waited so far (schedkit's own).",
            ),
        },
        ttft=Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _SGLANG_TTFT,
        ),
        itl=Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _SGLANG_ITL,
        ),
        e2e=Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            _SGLANG_E2E,
        ),
        queue_time=Histogram(
            "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", _SGLANG_QUEUE
        ),
        tpot=None,
        prompt_tokens="sglang:prompt_tokens_total",
        generation_tokens="sglang:generation_tokens_total",
        cached_tokens="sglang:cached_tokens_total",
        requests="sglang:num_requests_total",
        aborted_requests="sglang:num_aborted_requests_total",
        realtime_tokens="sglang:realtime_tokens_total",
    ),
    "vllm": MetricsProfile(
        labels=("model_name", "engine"),
        gauges={
            "num_running_reqs": (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
            ),
            "num_queue_reqs": (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
            ),
            "token_usage": (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
            ),
        },
        ttft=Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _VLLM_TTFT,
        ),
        itl=Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _VLLM_ITL,
        ),
        e2e=Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _VLLM_REQUEST_LATENCY,
        ),
        queue_time=Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _VLLM_REQUEST_LATENCY,
        ),
        tpot=Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _VLLM_ITL,
        ),
        prompt_tokens="vllm:prompt_tokens",
        generation_tokens="vllm:generation_tokens",
        cached_tokens="vllm:prompt_tokens_cached",
        requests="vllm:request_success",
        aborted_requests=None,
        prefix_cache_queries="vllm:prefix_cache_queries",
        prefix_cache_hits="vllm:prefix_cache_hits",
    ),
}
