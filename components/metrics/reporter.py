"""The metrics reporter: throughput, cache hit rate and pool usage, logged and exported.

The batch result processor calls ``report_prefill_stats`` after each prefill batch,
``increment_generated_tokens``/``advance_forward_ct_decode``/``report_decode_stats`` after each
decode step; the host calls ``maybe_log_idle_metrics`` when idle and ``on_pause`` at the end of
``pause_generation``. KV events are flushed (``publish_kv_events``) at the end of every prefill
report, every ``decode_log_interval``-th decode report and every pause.

Throughputs and the cache hit rate are kept current whether or not metrics are enabled (they
cost a few additions); with ``enable_metrics`` the reporter also fills the pool and queue stats,
logs a line per report through the collector when ``log_batches`` is on (as SGLang does at info
level; off by default, since at saturation a line per batch costs the scheduler CPU), keeps
Prometheus metrics (gauges, token counters, and per finished request, through
``observe_finished_request``, which the scheduler calls: latency histograms and request and
token counters) named as ``metrics_profile`` says (``sglang`` or ``vllm``), serves them when
``prometheus_port`` is set, and emits KV metrics.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs

from schedkit.components.metrics.collector import MetricsCollector, SchedulerStats
from schedkit.core.component import ArgumentError, at_least, component
from schedkit.core.protocols import LoadInquirer
from schedkit.core.schedule_batch import Req, ScheduleBatch

__all__ = ["IDLE_LOG_INTERVAL", "MetricsCollector", "MetricsReporter", "SchedulerStats"]

IDLE_LOG_INTERVAL = 30.0  # seconds between two idle stats logs
FORWARD_CT_MOD = 1 << 30


def _noop() -> None:
    return None


@component("metrics_reporter")
class MetricsReporter:
    """Owns ``stats``, ``num_generated_tokens``, ``forward_ct_decode``, the throughputs and the
    collector. ``now`` is the scheduler's clock (virtual or wall); ``load_inquirer`` supplies
    the pool and queue numbers and is required with ``enable_metrics``. ``metrics_profile``
    names the Prometheus metrics as SGLang (the default) or vLLM does; ``model_name`` labels
    them, and under ``vllm`` so does ``dp_rank`` (as ``engine``)."""

    load_inquirer: LoadInquirer | None = None
    emit_kv_metrics: Callable[[], None] = _noop
    publish_kv_events: Callable[[], None] = _noop
    # Whether ``publish_kv_events`` has anything to publish (None: assume it may).
    kv_events_pending: Callable[[], bool] | None = None
    now: Callable[[], float] = time.monotonic
    decode_log_interval: int = attrs.field(default=40, validator=at_least(1))
    enable_metrics: bool = False
    prometheus_port: int | None = None
    log_format: Literal["console", "json"] = "console"
    log_batches: bool = False
    metrics_profile: Literal["sglang", "vllm"] = "sglang"
    model_name: str = "default"
    dp_rank: int | None = None

    stats: SchedulerStats = attrs.field(init=False, factory=SchedulerStats)
    num_generated_tokens: int = attrs.field(init=False, default=0)
    forward_ct_decode: int = attrs.field(init=False, default=0)
    last_gen_throughput: float = attrs.field(init=False, default=0.0)
    last_input_throughput: float = attrs.field(init=False, default=0.0)
    total_prefill_tokens: int = attrs.field(init=False, default=0)
    total_cached_tokens: int = attrs.field(init=False, default=0)
    total_cached_tokens_host: int = attrs.field(init=False, default=0)
    last_prefill_stats_tic: float = attrs.field(init=False, default=0.0)
    last_decode_stats_tic: float = attrs.field(init=False, default=0.0)
    collector: MetricsCollector = attrs.field(init=False, default=None)

    @classmethod
    def check_arguments(cls, args: Any) -> None:
        """Argument checks that need no build (``schedkit validate`` runs them too)."""
        if args.log_format not in ("console", "json"):
            raise ArgumentError(
                "log_format", f"log_format must be 'console' or 'json', got {args.log_format!r}"
            )
        port = args.prometheus_port
        if port is not None:
            if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
                raise ArgumentError(
                    "prometheus_port",
                    f"prometheus_port must be a port number 0-65535, got {port!r}",
                )
            if not args.enable_metrics:
                raise ArgumentError(
                    "prometheus_port",
                    "prometheus_port is set but enable_metrics is false; set enable_metrics: "
                    "true to serve metrics (or remove prometheus_port)",
                )
        if args.enable_metrics and args.load_inquirer is None:
            raise ArgumentError(
                "enable_metrics",
                "enable_metrics needs a load_inquirer to read pool and queue stats",
            )

    def __attrs_post_init__(self) -> None:
        self.check_arguments(self)
        labels = (self.model_name,)
        if self.metrics_profile == "vllm":
            labels += (str(self.dp_rank or 0),)
        self.collector = MetricsCollector(
            now=self.now,
            log_format=self.log_format,
            export=self.enable_metrics,
            prometheus_port=self.prometheus_port,
            profile=self.metrics_profile,
            label_values=labels,
        )
        self.last_prefill_stats_tic = self.last_decode_stats_tic = self.now()

    def observe_finished_request(self, req: Req) -> None:
        """With metrics on: a finished request's latencies and token counts into Prometheus."""
        if self.enable_metrics:
            self.collector.observe_finished(req)

    def increment_generated_tokens(self, n: int) -> None:
        """Count ``n`` newly generated tokens."""
        self.num_generated_tokens += n

    def advance_forward_ct_decode(self) -> None:
        """Count one decode step (mod 2**30)."""
        self.forward_ct_decode = (self.forward_ct_decode + 1) % FORWARD_CT_MOD

    def decode_steps_to_report(self) -> int:
        """Decode steps until the first whose ``report_decode_stats`` does more than note the
        generation throughput (that one included): a run of decode steps counted by
        ``advance_decode_run`` ends there. With metrics off and no KV event pending
        (``kv_events_pending``; a run of decode steps records none), a report only notes the
        throughput, which ``advance_decode_run`` does too: the run may pass reports."""
        ct, interval = self.forward_ct_decode, self.decode_log_interval
        wrap = FORWARD_CT_MOD - ct
        pending = self.kv_events_pending
        if not self.enable_metrics and pending is not None and not pending():
            return wrap
        return min(interval - ct % interval, wrap)

    def advance_decode_run(self, times: Sequence[float], batch_size: int) -> None:
        """``len(times)`` decode steps of ``batch_size`` requests ending at ``times``, within
        ``decode_steps_to_report``: what as many ``increment_generated_tokens`` and
        ``advance_forward_ct_decode`` calls do, and the throughput noted by the reports of
        the steps before the last (the last step's report is ``report_decode_stats``'s)."""
        steps = len(times)
        ct, interval = self.forward_ct_decode, self.decode_log_interval
        generated = self.num_generated_tokens
        reported = 0  # steps counted up to the last report in the run
        for step in range(interval - ct % interval, steps, interval):
            now = times[step - 1]
            generated += batch_size * (step - reported)
            gap = now - self.last_decode_stats_tic
            self.last_decode_stats_tic = now
            self.last_gen_throughput = generated / gap if gap > 0 else 0.0
            self.stats.gen_throughput = self.last_gen_throughput
            generated, reported = 0, step
        self.num_generated_tokens = generated + batch_size * (steps - reported)
        self.forward_ct_decode = (ct + steps) % FORWARD_CT_MOD

    def report_prefill_stats(self, batch: ScheduleBatch) -> None:
        """Input throughput and cache hit rate of a prefill batch; then flush KV events."""
        now = self.now()
        new_tokens = sum(batch.extend_lens)
        cached_tokens = sum(batch.cache_hit_lens)
        gap = now - self.last_prefill_stats_tic
        self.last_prefill_stats_tic = now
        self.last_input_throughput = new_tokens / gap if gap > 0 else 0.0
        self.total_prefill_tokens += new_tokens
        self.total_cached_tokens += cached_tokens
        seen = self.total_prefill_tokens + self.total_cached_tokens
        stats = self.stats
        stats.input_throughput = self.last_input_throughput
        stats.cache_hit_rate = self.total_cached_tokens / seen if seen else 0.0
        if batch.host_hit_tokens:
            self.total_cached_tokens_host += batch.host_hit_tokens
        host = self.total_cached_tokens_host
        stats.cache_hit_rate_host = host / seen if seen else 0.0
        stats.cache_hit_rate_device = (self.total_cached_tokens - host) / seen if seen else 0.0
        if self.enable_metrics:
            reqs = batch.reqs
            stats.avg_request_queue_latency = (
                sum(r.wait_queue_exit_time - r.wait_queue_entry_time for r in reqs) / len(reqs)
                if reqs
                else 0.0
            )
            self._fill_stats(len(self.load_inquirer.get_running_batch().reqs))
            self.collector.count_tokens(prompt=new_tokens, cached=cached_tokens)
            if self.log_batches:
                self._log_prefill(batch, new_tokens, cached_tokens)
            self.collector.log_stats(stats)
            self.emit_kv_metrics()
        self.publish_kv_events()

    def _log_prefill(self, batch: ScheduleBatch, new_tokens: int, cached_tokens: int) -> None:
        stats = self.stats
        self.collector.logger.info(
            "prefill batch",
            new_seq=batch.batch_size(),
            new_token=new_tokens,
            cached_token=cached_tokens,
            token_usage=round(stats.token_usage, 2),
            running_req=stats.num_running_reqs,
            queue_req=stats.num_queue_reqs,
            input_throughput=round(self.last_input_throughput, 2),
        )

    def report_decode_stats(self, batch: ScheduleBatch) -> None:
        """Every ``decode_log_interval`` decode steps: generation throughput over the interval
        (tokens counted since the last report / elapsed time), logs, then flush KV events."""
        if self.forward_ct_decode % self.decode_log_interval:
            return
        now = self.now()
        gap = now - self.last_decode_stats_tic
        self.last_decode_stats_tic = now
        generated = self.num_generated_tokens
        self.num_generated_tokens = 0
        self.last_gen_throughput = generated / gap if gap > 0 else 0.0
        stats = self.stats
        stats.gen_throughput = self.last_gen_throughput
        if self.enable_metrics:
            self._fill_stats(batch.batch_size())
            self.collector.count_tokens(generated=generated)
            if self.log_batches:
                self.collector.logger.info(
                    "decode batch",
                    running_req=stats.num_running_reqs,
                    token_usage=round(stats.token_usage, 2),
                    gen_throughput=round(self.last_gen_throughput, 2),
                    queue_req=stats.num_queue_reqs,
                )
            self.collector.log_stats(stats)
            self.emit_kv_metrics()
        self.publish_kv_events()

    def maybe_log_idle_metrics(self) -> None:
        """With metrics on: zero the queue latency and wait (the scheduler idles); with 30 s
        since the last stats log: zero the throughput, log. Exported gauges are refreshed on
        every idle call, so that they never show requests that have finished."""
        if not self.enable_metrics:
            return
        stats = self.stats
        stats.avg_request_queue_latency = stats.queue_wait_time = 0.0
        if self.collector.exports:
            self._fill_stats(len(self.load_inquirer.get_running_batch().reqs), idle=True)
            stats.gen_throughput = 0.0
            self.collector.export(stats)
        if self.now() <= self.collector.last_log_time + IDLE_LOG_INTERVAL:
            return
        self._fill_stats(len(self.load_inquirer.get_running_batch().reqs), idle=True)
        stats.gen_throughput = 0.0
        self.collector.logger.info(
            "idle",
            running_req=stats.num_running_reqs,
            queue_req=stats.num_queue_reqs,
            token_usage=round(stats.token_usage, 2),
        )
        self.collector.log_stats(stats)

    def on_pause(self) -> None:
        """End of ``pause_generation`` (every mode): the loop stops reaching ``on_idle``, so
        zero the throughput, force one idle stats log when metrics are on, and flush KV events.

        The idle-log clock is reset to minus infinity rather than SGLang's 0 so that the log
        also fires under a virtual clock that starts near 0.
        """
        self.last_gen_throughput = 0.0
        self.stats.gen_throughput = 0.0
        if self.enable_metrics:
            self.collector.last_log_time = -math.inf
            self.maybe_log_idle_metrics()
        self.publish_kv_events()

    def shutdown(self) -> None:
        """Stop the collector's Prometheus server."""
        self.collector.shutdown()

    def _fill_stats(self, num_running_reqs: int, idle: bool = False) -> None:
        inquirer, stats = self.load_inquirer, self.stats
        capacity = inquirer.allocator.size
        stats.num_running_reqs = num_running_reqs
        waiting = inquirer.get_waiting_queue()
        stats.num_queue_reqs = len(waiting)
        stats.queue_wait_time = 0.0 if idle else waiting.mean_wait(self.now())
        if idle:
            stats.avg_request_queue_latency = 0.0
        stats.num_used_tokens = inquirer.num_used_tokens()
        stats.token_usage = stats.num_used_tokens / capacity if capacity else 0.0
