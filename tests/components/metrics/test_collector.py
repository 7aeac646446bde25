"""MetricsCollector alone: the idle-log clock, exports without Prometheus, a busy port."""

import socket

import pytest

from schedkit.components.metrics.collector import MetricsCollector, SchedulerStats


def test_log_stats_restarts_the_clock_and_exports_nothing_without_prometheus():
    clock = iter([1.0, 7.5])
    collector = MetricsCollector(now=lambda: next(clock))
    assert collector.last_log_time == 1.0 and not collector.exports
    collector.log_stats(SchedulerStats(num_running_reqs=3))
    collector.count_tokens(prompt=5, generated=2)
    assert collector.last_log_time == 7.5 and collector.prometheus_port is None
    collector.shutdown()


def test_a_busy_prometheus_port_is_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            ValueError, match=rf"cannot serve Prometheus metrics on 127\.0\.0\.1:{port}"
        ):
            MetricsCollector(now=lambda: 0.0, prometheus_port=port)


def test_collectors_have_registries_of_their_own():
    first = MetricsCollector(now=lambda: 0.0, export=True)
    second = MetricsCollector(now=lambda: 0.0, export=True)  # same names: no clash
    assert first.registry is not second.registry
    assert MetricsCollector(now=lambda: 0.0).registry is None  # metrics off: no registry


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({"profile": "tgi"}, "metrics profile must be one of 'sglang', 'vllm', got 'tgi'"),
        ({"profile": "vllm", "label_values": ("m",)}, "labels metrics with model_name, engine"),
    ],
)
def test_bad_profile_settings_are_refused(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        MetricsCollector(now=lambda: 0.0, export=True, **kwargs)
