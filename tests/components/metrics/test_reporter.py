import json
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from schedkit.components.metrics.reporter import FORWARD_CT_MOD, MetricsReporter, SchedulerStats
from schedkit.components.scheduler.waiting_queue import WaitingQueue
from schedkit.core.component import component_name
from schedkit.core.schedule_batch import ForwardMode, Req, ScheduleBatch


class Clock:
    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


class Recorder:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1


def fake_inquirer(running=2, waiting=3, used=25, capacity=100):
    """The slice of LoadInquirer the reporter reads."""
    reqs = [Req(rid=f"r{i}", origin_input_ids=[1]) for i in range(running)]
    return SimpleNamespace(
        allocator=SimpleNamespace(size=capacity),
        num_used_tokens=lambda: used,
        get_waiting_queue=lambda: WaitingQueue(
            Req(rid=f"w{i}", origin_input_ids=[1]) for i in range(waiting)
        ),
        get_running_batch=lambda: ScheduleBatch(reqs=reqs, forward_mode=ForwardMode.DECODE),
    )


def scraped(body):
    """Sample values by name (and by the ``mode`` label, where there is one) from a text
    exposition, read with prometheus_client's own parser."""
    samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            mode = sample.labels.get("mode")
            samples[sample.name if mode is None else (sample.name, mode)] = sample.value
    return samples


def make_reporter(**kwargs):
    kwargs.setdefault("now", Clock())
    kwargs.setdefault("publish_kv_events", Recorder())
    kwargs.setdefault("emit_kv_metrics", Recorder())
    kwargs.setdefault("load_inquirer", fake_inquirer())
    return MetricsReporter(**kwargs)


def decode_batch(n):
    reqs = [Req(rid=f"d{i}", origin_input_ids=[1]) for i in range(n)]
    return ScheduleBatch(reqs=reqs, forward_mode=ForwardMode.DECODE)


def prefill_batch(prefix_lens, extend_lens):
    reqs = [Req(rid=f"p{i}", origin_input_ids=[1]) for i in range(len(prefix_lens))]
    return ScheduleBatch(
        reqs=reqs,
        forward_mode=ForwardMode.EXTEND,
        prefix_lens=list(prefix_lens),
        extend_lens=list(extend_lens),
        cache_hit_lens=list(prefix_lens),
    )


def run_decode_steps(reporter, steps, tokens_per_step, seconds_per_step, batch_size=8):
    for _ in range(steps):
        reporter.now.t += seconds_per_step
        reporter.increment_generated_tokens(tokens_per_step)
        reporter.advance_forward_ct_decode()
        reporter.report_decode_stats(decode_batch(batch_size))


def test_registered_name():
    assert component_name(MetricsReporter) == "metrics_reporter"


@pytest.mark.parametrize("enable_metrics", [False, True])
def test_decode_stats_every_interval_compute_throughput(enable_metrics, capsys):
    reporter = make_reporter(decode_log_interval=4, enable_metrics=enable_metrics, log_batches=True)
    run_decode_steps(reporter, 3, tokens_per_step=8, seconds_per_step=0.5)
    assert reporter.publish_kv_events.calls == 0
    assert reporter.last_gen_throughput == 0.0
    run_decode_steps(reporter, 1, tokens_per_step=8, seconds_per_step=0.5)
    assert reporter.last_gen_throughput == 32 / 2.0
    assert reporter.stats.gen_throughput == 16.0
    assert reporter.num_generated_tokens == 0
    assert reporter.publish_kv_events.calls == 1
    assert reporter.emit_kv_metrics.calls == (1 if enable_metrics else 0)
    # The next interval measures only its own tokens and time.
    run_decode_steps(reporter, 4, tokens_per_step=2, seconds_per_step=1.0)
    assert reporter.last_gen_throughput == 2.0
    assert reporter.publish_kv_events.calls == 2
    logged = capsys.readouterr().err
    assert ("decode batch" in logged) == enable_metrics


def test_decode_stats_fill_pool_and_queue_stats_when_metrics_are_on():
    reporter = make_reporter(decode_log_interval=1, enable_metrics=True)
    run_decode_steps(reporter, 1, tokens_per_step=5, seconds_per_step=1.0, batch_size=5)
    stats = reporter.stats
    assert (stats.num_running_reqs, stats.num_queue_reqs) == (5, 3)
    assert (stats.num_used_tokens, stats.token_usage) == (25, 0.25)
    assert reporter.collector.last_log_time == reporter.now.t


@pytest.mark.parametrize(
    ("enable_metrics", "pending", "passes"),
    [(False, False, True), (False, True, False), (True, False, False), (False, None, False)],
    ids=["passes-reports", "events-pending", "metrics-on", "not-wired"],
)
@pytest.mark.parametrize("steps", [10, 11])
def test_a_decode_run_notes_the_throughput_of_the_reports_it_passes(
    enable_metrics, pending, passes, steps
):
    kwargs = {"decode_log_interval": 4, "enable_metrics": enable_metrics}
    if pending is not None:
        kwargs["kv_events_pending"] = lambda: pending
    stepped, run = make_reporter(**kwargs), make_reporter(**kwargs)
    for reporter in (stepped, run):
        run_decode_steps(reporter, 1, tokens_per_step=8, seconds_per_step=0.5)
    bound = run.decode_steps_to_report()
    assert bound == (FORWARD_CT_MOD - 1 if passes else 3)
    # reports after the 3rd and 7th step inside the run, and after the 11th
    seconds = [0.5, 0.25, 1.0, 0.5, 0.75, 2.0, 0.5, 1.0, 0.25, 0.5, 1.5][: min(steps, bound)]
    times = []
    for step in seconds:
        run_decode_steps(stepped, 1, tokens_per_step=6, seconds_per_step=step)
        times.append(stepped.now.t)
    run.now.t = times[-1]
    run.advance_decode_run(times, 6)  # then the last step's report, as a decode run does
    run.report_decode_stats(decode_batch(6))
    fields = ("num_generated_tokens", "forward_ct_decode", "last_gen_throughput")
    fields += ("last_decode_stats_tic",)
    assert [getattr(run, f) for f in fields] == [getattr(stepped, f) for f in fields]
    assert run.stats.gen_throughput == stepped.stats.gen_throughput > 0
    last_reports = len(seconds) in (3, 11)
    assert stepped.publish_kv_events.calls == (1 + len(seconds)) // 4
    assert run.publish_kv_events.calls == last_reports  # the last step's report only


def test_forward_ct_decode_wraps():
    reporter = make_reporter()
    reporter.forward_ct_decode = FORWARD_CT_MOD - 1
    reporter.advance_forward_ct_decode()
    assert reporter.forward_ct_decode == 0


@pytest.mark.parametrize("enable_metrics", [False, True])
def test_prefill_stats_cache_hit_rate_and_input_throughput(enable_metrics, capsys):
    reporter = make_reporter(enable_metrics=enable_metrics, log_batches=True)
    reporter.now.t = 2.0
    reporter.report_prefill_stats(prefill_batch([2, 0], [6, 4]))
    assert reporter.stats.cache_hit_rate == pytest.approx(2 / 12)
    assert reporter.last_input_throughput == 10 / 2.0
    assert reporter.publish_kv_events.calls == 1
    reporter.now.t = 3.0
    reporter.report_prefill_stats(prefill_batch([8], [0]))
    assert reporter.stats.cache_hit_rate == pytest.approx(10 / 20)  # cumulative
    assert reporter.last_input_throughput == 0.0
    assert reporter.publish_kv_events.calls == 2
    assert reporter.emit_kv_metrics.calls == (2 if enable_metrics else 0)
    assert ("prefill batch" in capsys.readouterr().err) == enable_metrics
    if enable_metrics:
        assert (reporter.stats.num_running_reqs, reporter.stats.num_queue_reqs) == (2, 3)


def test_idle_log_only_after_thirty_seconds_of_the_injected_clock(capsys):
    clock = Clock(100.0)
    reporter = make_reporter(now=clock, enable_metrics=True)
    reporter.stats.gen_throughput = 50.0
    for t in (110.0, 129.9, 130.0):
        clock.t = t
        reporter.maybe_log_idle_metrics()
        assert reporter.collector.last_log_time == 100.0
    assert "idle" not in capsys.readouterr().err
    clock.t = 130.5
    reporter.maybe_log_idle_metrics()
    assert reporter.collector.last_log_time == 130.5
    assert reporter.stats.gen_throughput == 0.0
    assert reporter.stats.num_queue_reqs == 3
    assert "idle" in capsys.readouterr().err
    clock.t = 150.0
    reporter.maybe_log_idle_metrics()
    assert reporter.collector.last_log_time == 130.5


def test_any_stats_log_restarts_the_idle_clock():
    clock = Clock()
    reporter = make_reporter(now=clock, enable_metrics=True)
    clock.t = 25.0
    reporter.report_prefill_stats(prefill_batch([0], [4]))
    clock.t = 40.0
    reporter.maybe_log_idle_metrics()
    assert reporter.collector.last_log_time == 25.0


def test_idle_log_is_off_without_metrics(capsys):
    clock = Clock()
    reporter = make_reporter(now=clock, load_inquirer=None)
    reporter.stats.gen_throughput = 9.0
    clock.t = 1000.0
    reporter.maybe_log_idle_metrics()
    assert reporter.stats.gen_throughput == 9.0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("enable_metrics", [False, True])
def test_pause_zeroes_throughput_and_flushes_events_on_every_call(enable_metrics, capsys):
    clock = Clock(5.0)  # a virtual clock near 0: the forced idle log must still fire
    reporter = make_reporter(now=clock, enable_metrics=enable_metrics, decode_log_interval=1)
    run_decode_steps(reporter, 1, tokens_per_step=10, seconds_per_step=1.0)
    assert reporter.last_gen_throughput == 10.0
    flushed = reporter.publish_kv_events.calls
    for i in range(1, 4):
        reporter.on_pause()
        assert reporter.last_gen_throughput == 0.0
        assert reporter.stats.gen_throughput == 0.0
        assert reporter.publish_kv_events.calls == flushed + i
    err = capsys.readouterr().err
    if enable_metrics:
        assert reporter.collector.last_log_time == clock.t
        assert err.count("idle") == 3
    else:
        assert "idle" not in err


def test_batches_are_not_logged_by_default_but_still_exported(capsys):
    reporter = make_reporter(enable_metrics=True, decode_log_interval=1)
    reporter.report_prefill_stats(prefill_batch([2, 0], [6, 4]))
    run_decode_steps(reporter, 2, tokens_per_step=3, seconds_per_step=1.0, batch_size=2)
    assert "batch" not in capsys.readouterr().err
    exposition = generate_latest(reporter.collector.registry).decode()
    assert "sglang:num_running_reqs" in exposition
    assert reporter.stats.gen_throughput == 3.0


def test_json_log_format(capsys):
    reporter = make_reporter(
        enable_metrics=True, log_format="json", decode_log_interval=1, log_batches=True
    )
    run_decode_steps(reporter, 1, tokens_per_step=12, seconds_per_step=2.0, batch_size=4)
    (line,) = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert entry["event"] == "decode batch"
    assert entry["level"] == "info"
    assert (entry["running_req"], entry["gen_throughput"]) == (4, 6.0)
    assert entry["logger"] == "schedkit.metrics"


def test_prometheus_endpoint_serves_gauges_and_counters():
    reporter = make_reporter(enable_metrics=True, prometheus_port=0, decode_log_interval=2)
    port = reporter.collector.prometheus_port
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        run_decode_steps(reporter, 2, tokens_per_step=8, seconds_per_step=0.25)
        reporter.report_prefill_stats(prefill_batch([3], [5]))
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
        samples = scraped(body)
        assert samples["sglang:gen_throughput"] == 32.0
        assert samples["sglang:num_queue_reqs"] == 3.0
        assert samples["sglang:token_usage"] == 0.25
        assert samples["sglang:realtime_tokens_total", "decode"] == 16.0
        assert samples["sglang:realtime_tokens_total", "prefill_compute"] == 5.0
        assert samples["sglang:realtime_tokens_total", "prefill_cache"] == 3.0
    finally:
        reporter.shutdown()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
    reporter.shutdown()  # idempotent


def test_gauges_refresh_on_idle_once_requests_have_finished():
    state = {"running": 4, "waiting": 3, "used": 60}
    inquirer = SimpleNamespace(
        allocator=SimpleNamespace(size=100),
        num_used_tokens=lambda: state["used"],
        get_waiting_queue=lambda: WaitingQueue(
            Req(rid=f"w{i}", origin_input_ids=[1]) for i in range(state["waiting"])
        ),
        get_running_batch=lambda: ScheduleBatch(
            reqs=[None] * state["running"], forward_mode=ForwardMode.DECODE
        ),
    )
    reporter = make_reporter(
        enable_metrics=True, prometheus_port=0, decode_log_interval=2, load_inquirer=inquirer
    )
    url = f"http://127.0.0.1:{reporter.collector.prometheus_port}/metrics"

    def gauges():
        with urllib.request.urlopen(url, timeout=5) as response:
            samples = scraped(response.read().decode())
        return {k: samples[f"sglang:{k}"] for k in ("num_running_reqs", "token_usage")}

    try:
        run_decode_steps(reporter, 2, tokens_per_step=8, seconds_per_step=0.25)
        assert gauges() == {"num_running_reqs": 8.0, "token_usage": 0.6}
        state.update(running=0, waiting=0, used=0)  # everything finished; the loop idles
        reporter.maybe_log_idle_metrics()  # well within the 30 s idle-log interval
        assert gauges() == {"num_running_reqs": 0.0, "token_usage": 0.0}
    finally:
        reporter.shutdown()


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({"prometheus_port": 0}, "enable_metrics is false"),
        ({"enable_metrics": True, "prometheus_port": 70000}, "port number 0-65535"),
        ({"enable_metrics": True, "load_inquirer": None}, "needs a load_inquirer"),
        ({"log_format": "xml"}, "log_format must be 'console' or 'json'"),
        ({"decode_log_interval": 0}, "decode_log_interval must be an integer >= 1"),
    ],
)
def test_bad_settings_are_refused(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        make_reporter(**kwargs)


def test_stats_defaults():
    stats = SchedulerStats()
    assert (stats.num_running_reqs, stats.token_usage, stats.cache_hit_rate) == (0, 0.0, 0.0)


def test_queue_latency_of_the_last_prefill_batch_and_wait_so_far_zeroed_on_idle():
    waiting = WaitingQueue(
        [
            Req(rid="a", origin_input_ids=[1], wait_queue_entry_time=1.0),
            Req(rid="b", origin_input_ids=[1], wait_queue_entry_time=3.0),
        ]
    )
    inquirer = fake_inquirer()
    inquirer.get_waiting_queue = lambda: waiting
    reporter = make_reporter(enable_metrics=True, load_inquirer=inquirer)
    reporter.now.t = 10.0
    batch = prefill_batch([0, 0], [4, 4])
    for req, (entered, left) in zip(batch.reqs, [(2.0, 5.0), (4.0, 10.0)], strict=True):
        req.wait_queue_entry_time, req.wait_queue_exit_time = entered, left
    reporter.report_prefill_stats(batch)
    # SGLang: sum(queue_time_end - queue_time_start) over the batch / its size.
    assert reporter.stats.avg_request_queue_latency == pytest.approx((3.0 + 6.0) / 2)
    assert reporter.stats.queue_wait_time == pytest.approx(((10 - 1) + (10 - 3)) / 2)
    reporter.maybe_log_idle_metrics()
    assert reporter.stats.avg_request_queue_latency == 0.0
    assert reporter.stats.queue_wait_time == 0.0
