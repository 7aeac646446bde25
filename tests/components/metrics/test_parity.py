"""Prometheus parity: after a small run of the default wiring, the registry's text exposition
(``prometheus_client.generate_latest``) carries SGLang's (or vLLM's) metric names, types and
histogram buckets, and counts that match the run.

The expected names and buckets are written out here from the engines' sources, independently
of ``components/metrics/profiles.py``:
- SGLang: ``python/sglang/srt/metrics/collector.py`` (``TokenizerMetricsCollector.__init__``
  default buckets; ``SchedulerMetricsCollector.queue_time``; the gauges and
  ``realtime_tokens_total`` of ``SchedulerMetricsCollector``).
- vLLM: ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger.__init__``, vLLM 0.11+).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import schedkit
from schedkit.core.schedule_batch import FinishAbort, Req, SamplingParams
from schedkit.sim.driver import drive
from schedkit.workloads.workload import Arrival, StaticWorkload

ROOT = Path(__file__).resolve().parents[3]

SGLANG_TTFT = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
SGLANG_E2E = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
              1200, 1800, 2400]  # fmt: skip
SGLANG_ITL = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
              0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000,
              8.000]  # fmt: skip
SGLANG_QUEUE = [0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100,
                200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000,
                2500, 3000]  # fmt: skip
VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
VLLM_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0]  # fmt: skip
VLLM_REQUEST_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                        50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip

EXPECTED = {
    "sglang": {
        "histograms": {
            "sglang:time_to_first_token_seconds": SGLANG_TTFT,
            "sglang:inter_token_latency_seconds": SGLANG_ITL,
            "sglang:e2e_request_latency_seconds": SGLANG_E2E,
            "sglang:queue_time_seconds": SGLANG_QUEUE,
        },
        "gauges": [
            "sglang:num_running_reqs",
            "sglang:num_queue_reqs",
            "sglang:num_used_tokens",
            "sglang:token_usage",
            "sglang:gen_throughput",
            "sglang:cache_hit_rate",
        ],
        "counters": {
            "prompt": "sglang:prompt_tokens_total",
            "generation": "sglang:generation_tokens_total",
            "cached": "sglang:cached_tokens_total",
            "requests": "sglang:num_requests_total",
            "aborted": "sglang:num_aborted_requests_total",
            "realtime": "sglang:realtime_tokens_total",
        },
        "labels": {"model_name"},
    },
    "vllm": {
        "histograms": {
            "vllm:time_to_first_token_seconds": VLLM_TTFT,
            "vllm:inter_token_latency_seconds": VLLM_ITL,
            "vllm:e2e_request_latency_seconds": VLLM_REQUEST_LATENCY,
            "vllm:request_queue_time_seconds": VLLM_REQUEST_LATENCY,
            "vllm:request_time_per_output_token_seconds": VLLM_ITL,
        },
        "gauges": [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
        ],
        "counters": {
            "prompt": "vllm:prompt_tokens_total",
            "generation": "vllm:generation_tokens_total",
            "cached": "vllm:prompt_tokens_cached_total",
            "requests": "vllm:request_success_total",
            "queries": "vllm:prefix_cache_queries_total",
            "hits": "vllm:prefix_cache_hits_total",
        },
        "labels": {"model_name", "engine"},
    },
}


def workload() -> tuple[StaticWorkload, list[Req]]:
    """Twelve requests sharing a prefix (so the cache hits), some of one token, and one that
    is refused (empty prompt)."""
    reqs = [
        Req(
            rid=f"r{i}",
            origin_input_ids=[5] * 48 + [100 + i] * (8 + i),
            sampling_params=SamplingParams(max_new_tokens=1 if i % 4 == 0 else 6 + i),
        )
        for i in range(12)
    ]
    reqs.append(Req(rid="empty", origin_input_ids=[]))
    arrivals = [Arrival(0.01 * i, req) for i, req in enumerate(reqs)]
    return StaticWorkload(arrivals), reqs


def run(profile: str):
    overlay = {
        "components": {
            "kv_events_publisher": {"args": {"kv_events_config": None}},
            "metrics_reporter": {
                "args": {"enable_metrics": True, "metrics_profile": profile, "model_name": "m"}
            },
        }
    }
    load, reqs = workload()
    with schedkit.build(schedkit.load_wiring(ROOT / "wiring.yaml", overlay)) as assembly:
        summary = drive(assembly, load)
        registry = assembly["metrics_reporter"].collector.registry
        families = {
            f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
        }
    return summary, reqs, families


def value(families, sample_name, **labels):
    for family in families.values():
        for sample in family.samples:
            if sample.name == sample_name and labels.items() <= sample.labels.items():
                return sample.value
    raise AssertionError(f"no sample {sample_name} {labels}")


@pytest.mark.parametrize("profile", ["sglang", "vllm"])
def test_exposition_names_types_buckets_and_counts(profile):
    summary, reqs, families = run(profile)
    expected = EXPECTED[profile]
    done = [r for r in reqs if not isinstance(r.finished_reason, FinishAbort)]
    assert summary.requests_done == len(done) == 12 and summary.requests_failed == 1
    by_sample = {s.name: f for f in families.values() for s in f.samples}

    for name, buckets in expected["histograms"].items():
        family = families[name]
        assert family.type == "histogram", name
        bounds = [float(s.labels["le"]) for s in family.samples if s.name == f"{name}_bucket"]
        assert bounds == [*map(float, buckets), math.inf], name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == expected["labels"], name
    for name in expected["gauges"]:
        assert families[name].type == "gauge", name
    for name in expected["counters"].values():
        assert by_sample[name].type == "counter", name

    counters = expected["counters"]
    histograms = list(expected["histograms"])
    assert value(families, counters["prompt"]) == sum(len(r.origin_input_ids) for r in reqs)
    assert value(families, counters["generation"]) == summary.output_tokens
    assert value(families, counters["cached"]) == sum(r.cached_tokens for r in reqs) > 0
    # e2e: every finished request; TTFT and queue time: those that were admitted
    assert value(families, f"{histograms[2]}_count") == len(reqs)
    assert value(families, f"{histograms[0]}_count") == len(done)
    assert value(families, f"{histograms[3]}_count") == len(done)
    assert value(families, f"{histograms[1]}_count") == sum(len(r.itl) for r in reqs) > 0
    ttft_sum = sum(r.first_token_time - r.arrival_time for r in done)
    assert value(families, f"{histograms[0]}_sum") == pytest.approx(ttft_sum)
    if profile == "sglang":
        assert value(families, counters["requests"]) == len(reqs)
        assert value(families, counters["aborted"]) == 1
        computed = value(families, counters["realtime"], mode="prefill_compute")
        assert computed + value(families, counters["realtime"], mode="prefill_cache") == sum(
            len(r.origin_input_ids) for r in done
        )
    else:
        reasons = {
            reason: value(families, counters["requests"], finished_reason=reason)
            for reason in ("stop", "length", "abort")
        }
        assert reasons == {"stop": 0, "length": 12, "abort": 1}
        assert value(families, "vllm:request_time_per_output_token_seconds_count") == sum(
            1 for r in done if len(r.output_ids) > 1
        )
        hits = value(families, counters["hits"])
        assert hits == sum(r.cached_tokens for r in reqs)
        assert value(families, counters["queries"]) == sum(len(r.origin_input_ids) for r in done)
