import random
import threading
import time
from array import array
from collections import Counter
from types import SimpleNamespace

import pytest

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.io.io_struct import ControlRequest
from schedkit.components.io.request_receiver import InprocRequestReceiver
from schedkit.components.scheduler.batch_result_processor import BatchResultProcessor
from schedkit.components.scheduler.schedule_policy import FCFSPolicy, LPMPolicy
from schedkit.components.scheduler.scheduler import Scheduler
from schedkit.core.component import component_name
from schedkit.core.schedule_batch import (
    FinishAbort,
    FinishLength,
    ForwardMode,
    Req,
    SamplingParams,
)
from schedkit.runner.model_runner import SimulatedModelRunner


class RecordingStreamer:
    """Counts final sends per rid and remembers which requests each call skipped."""

    def __init__(self):
        self.finishes = Counter()
        self.calls = []

    def stream_output(self, reqs, return_logprob=False, skip_req=None):
        sent = [r for r in reqs if r is not skip_req]
        self.calls.append([r.rid for r in sent])
        self.finishes.update(r.rid for r in sent if r.finished_reason is not None)


class RecordingRunner:
    """Delegates to a zero-cost simulated runner and records each batch's shape."""

    def __init__(self):
        self.inner = SimulatedModelRunner(zero_cost=True)
        self.batches = []

    def forward(self, batch):
        self.batches.append(
            SimpleNamespace(
                mode=batch.forward_mode,
                rids=[r.rid for r in batch.reqs],
                prefix_lens=list(batch.prefix_lens),
                extend_lens=list(batch.extend_lens),
            )
        )
        return self.inner.forward(batch)

    def now(self):
        return self.inner.now()

    def prefills(self):
        return [b for b in self.batches if b.mode == ForwardMode.EXTEND]


def build(pool=512, page_size=1, policy=None, **settings):
    allocator = TokenToKVPoolAllocator(size=pool, page_size=page_size)
    cache = RadixCache(allocator=allocator, page_size=page_size)
    streamer = RecordingStreamer()
    runner = RecordingRunner()
    hooks = []
    finished = []
    host = {}
    processor = BatchResultProcessor(
        allocator=allocator,
        tree_cache=cache,
        output_streamer=streamer,
        abort_request=lambda rid: host["scheduler"].abort_request(rid),
    )
    scheduler = Scheduler(
        request_receiver=InprocRequestReceiver(),
        allocator=allocator,
        tree_cache=cache,
        policy=policy or FCFSPolicy(),
        model_runner=runner,
        batch_result_processor=processor,
        now=runner.now,
        publish_kv_events=lambda: hooks.append("publish_kv_events"),
        maybe_log_idle_metrics=lambda: hooks.append("maybe_log_idle_metrics"),
        on_pause=lambda: hooks.append("on_pause"),
        on_finish=finished.append,
        **settings,
    )
    host["scheduler"] = scheduler
    return SimpleNamespace(
        s=scheduler,
        allocator=allocator,
        cache=cache,
        streamer=streamer,
        runner=runner,
        hooks=hooks,
        finished=finished,
        pool=pool,
    )


def make_req(rid, prompt, max_new_tokens=8, **params):
    return Req(
        rid=rid,
        origin_input_ids=list(prompt),
        sampling_params=SamplingParams(max_new_tokens=max_new_tokens, **params),
    )


def tokens(n, start):
    return list(range(start, start + n))


def assert_all_done(env, reqs, aborted=()):
    """Every request finished once with max_new_tokens deterministic tokens (or was refused,
    for those in ``aborted``); no KV leaked."""
    s = env.s
    for req in aborted:
        assert isinstance(req.finished_reason, FinishAbort), req.rid
        assert env.streamer.finishes[req.rid] == 1, req.rid
    for req in reqs:
        n = req.sampling_params.max_new_tokens
        assert req.finished_reason == FinishLength(n), req.rid
        assert req.output_ids == [env.runner.inner.token(req.rid, p) for p in range(n)], req.rid
        assert env.streamer.finishes[req.rid] == 1, req.rid
    assert s.finished_count == len(reqs) + len(aborted)
    # on_finish saw every request once, each after its final output
    assert Counter(r.rid for r in env.finished) == Counter(r.rid for r in [*reqs, *aborted])
    assert not s.waiting_queue and not s.running_batch.reqs and s.chunked_req is None
    assert env.cache.protected_size() == 0
    assert env.allocator.available_size() + env.cache.total_size() == env.pool
    assert s.peak_running_requests <= s.max_running_requests


def test_registered_name_and_slotted_across_its_mixins():
    assert component_name(Scheduler) == "scheduler"
    assert not hasattr(build().s, "__dict__")


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_every_request_finishes_once_with_max_new_tokens(policy):
    env = build(max_running_requests=4)
    if policy == "lpm":
        env.s.policy = LPMPolicy(tree_cache=env.cache)
    reqs = [
        make_req(f"r{i}", tokens(5 + i, 1000 * (i % 3)), max_new_tokens=3 + i) for i in range(10)
    ]
    for req in reqs:
        env.s.submit(req)
    env.s.run_until_idle()
    assert_all_done(env, reqs)
    assert env.s.peak_running_requests == 4


@pytest.mark.parametrize("page_size", [1, 4])
def test_kv_pressure_retracts_and_retracted_requests_resume(page_size):
    env = build(
        pool=64,
        page_size=page_size,
        max_running_requests=8,
        init_new_token_ratio=0.0,
        min_new_token_ratio=0.0,
        chunked_prefill_size=16,
    )
    reqs = [make_req(f"r{i}", tokens(8, 100 * i), max_new_tokens=24) for i in range(6)]
    for req in reqs:
        env.s.submit(req)
    for _ in range(500):
        if env.s.num_retracted:
            break
        assert env.s.step()
    assert env.s.num_retracted > 0
    retracted = [r for r in env.s.waiting_queue if r.is_retracted]
    assert retracted
    kept = {r.rid: list(r.output_ids) for r in retracted}
    for req in retracted:
        assert req.kv_indices == [] and req.last_node is None and req.retraction_count == 1
        assert req.finished_reason is None
    assert any(kept.values())
    env.s.run_until_idle()
    assert_all_done(env, reqs)
    for req in retracted:
        assert req.output_ids[: len(kept[req.rid])] == kept[req.rid]


def test_unfittable_and_invalid_requests_are_aborted_and_the_loop_goes_on():
    env = build(pool=64)
    too_long = make_req("too_long", tokens(60, 1), max_new_tokens=5)
    bad_params = make_req("bad_params", tokens(4, 1), max_new_tokens=0)
    empty = make_req("empty", [])
    bad_interval = make_req("bad_interval", tokens(4, 1), stream_interval=0)
    ok = make_req("ok", tokens(50, 1), max_new_tokens=14)  # 64 tokens: fits exactly
    receiver = env.s.request_receiver
    for req in (too_long, bad_params, empty, bad_interval, ok):
        receiver.put(req)
    env.s.run_until_idle()
    assert "can never fit in the KV pool of 64 tokens" in too_long.finished_reason.message
    assert "max_new_tokens must be an integer >= 1" in bad_params.finished_reason.message
    assert "input_ids is empty" in empty.finished_reason.message
    assert "stream_interval" in bad_interval.finished_reason.message
    for req in (too_long, bad_params, empty, bad_interval):
        assert isinstance(req.finished_reason, FinishAbort)
        assert env.streamer.finishes[req.rid] == 1
        assert req.output_ids == []
    assert ok.finished_reason == FinishLength(14)
    assert env.s.finished_count == 5


def test_model_limits_refuse_and_clip_as_sglang_does():
    # SGLang: max_req_len = min(context_len - 1, pool - 1) = 63, max_req_input_len = 58.
    env = build(pool=512, context_length=64, vocab_size=100)
    shared = SamplingParams(max_new_tokens=20)
    at_limit = make_req("at_limit", tokens(58, 1))
    fits = Req(rid="fits", origin_input_ids=tokens(57, 1), sampling_params=shared)
    short = Req(rid="short", origin_input_ids=tokens(3, 97), sampling_params=shared)
    oov = make_req("oov", [5, 6, 100, 7, 250])
    oov_packed = Req(rid="oov_packed", origin_input_ids=array("I", [1, 2, 3, 70000]))
    for req in (at_limit, fits, short, oov, oov_packed):
        env.s.submit(req)
    env.s.run_until_idle()
    assert at_limit.finished_reason == FinishAbort(
        "Input length (58 tokens) exceeds the maximum allowed length (58 tokens). Use a shorter "
        "input or enable --allow-auto-truncate."
    )
    assert oov.finished_reason == FinishAbort(
        "The input_ids contains values greater than the vocab size (100): token id 100 at "
        "position 2."
    )
    assert "token id 70000 at position 3" in oov_packed.finished_reason.message
    # max_new_tokens clipped to max_req_len - prompt - 1 = 5, on a copy of the shared params
    assert fits.finished_reason == FinishLength(5) and len(fits.output_ids) == 5
    assert short.finished_reason == FinishLength(20) and shared.max_new_tokens == 20
    for req in (at_limit, oov, oov_packed):
        assert env.streamer.finishes[req.rid] == 1 and req.output_ids == []
    assert env.allocator.available_size() == env.pool - env.cache.evictable_size()
    # The KV pool bounds max_req_len too (pool 32: max_req_input_len 26).
    env = build(pool=32, context_length=64)
    small = make_req("small", tokens(26, 1))
    env.s.submit(small)
    assert "maximum allowed length (26 tokens)" in small.finished_reason.message
    # Without limits (the default) a long prompt of any ids runs as before.
    env = build(pool=512)
    free = make_req("free", tokens(300, 1_000_000))
    env.s.submit(free)
    env.s.run_until_idle()
    assert free.finished_reason == FinishLength(8)


def test_auto_truncate_cuts_the_prompt_to_max_req_input_len():
    env = build(pool=512, context_length=64, allow_auto_truncate=True)
    long = make_req("long", tokens(100, 1), max_new_tokens=50)
    env.s.submit(long)
    env.s.run_until_idle()
    assert list(long.origin_input_ids) == tokens(58, 1)
    assert long.finished_reason == FinishLength(4)  # 63 - 58 - 1


def test_shared_prefix_is_not_recomputed():
    env = build()
    shared = tokens(12, 500)
    first = make_req("first", [*shared, 1, 2, 3, 4], max_new_tokens=4)
    env.s.submit(first)
    assert env.s.step()  # prefill of "first"; it is still running
    assert first.cached_tokens == 0
    during = make_req("during", [*shared, 7])
    env.s.submit(during)
    assert env.s.step()
    assert env.runner.batches[-1].rids == ["during"]
    assert env.runner.batches[-1].prefix_lens == [12]
    assert env.runner.batches[-1].extend_lens == [1]
    assert during.cached_tokens == 12 and during.cached_tokens_device == 12
    env.s.run_until_idle()

    after = make_req("after", [*shared, 1, 2, 9, 9, 9])
    env.s.submit(after)
    assert env.s.step()
    assert env.runner.batches[-1].prefix_lens == [14]
    assert env.runner.batches[-1].extend_lens == [3]
    assert after.cached_tokens == 14
    env.s.run_until_idle()
    assert_all_done(env, [first, during, after])


def test_chunked_prefill_splits_a_long_prompt_and_middle_chunks_emit_nothing():
    env = build(chunked_prefill_size=16)
    long = make_req("long", tokens(40, 1), max_new_tokens=3)
    short = make_req("short", tokens(5, 900), max_new_tokens=3)
    env.s.submit(long)
    env.s.submit(short)
    for expected_prefix in (0, 16):
        assert env.s.step()
        batch = env.runner.batches[-1]
        assert (batch.rids, batch.prefix_lens, batch.extend_lens) == (
            ["long"],
            [expected_prefix],
            [16],
        )
        assert env.s.chunked_req is long and long.is_chunked
        assert long.output_ids == [] and env.streamer.calls[-1] == []
        assert env.cache.match_prefix(long.origin_input_ids).prefix_len == expected_prefix + 16
    assert env.s.step()
    batch = env.runner.batches[-1]
    assert (batch.rids, batch.prefix_lens, batch.extend_lens) == (
        ["long", "short"],
        [32, 0],
        [8, 5],
    )
    assert env.s.chunked_req is None and not long.is_chunked
    assert len(long.output_ids) == 1
    assert long.cached_tokens == 0
    env.s.run_until_idle()
    assert_all_done(env, [long, short])


def start_three(env):
    reqs = [make_req(f"r{i}", tokens(6, 10 * i), max_new_tokens=10) for i in range(3)]
    for req in reqs:
        env.s.submit(req)
    for _ in range(3):
        assert env.s.step()
    assert [r.rid for r in env.s.running_batch.reqs] == ["r0", "r1", "r2"]
    for req in reqs:  # KV for every token but the newest
        assert req.num_computed_tokens == len(req.kv_indices) == req.seqlen - 1
    return reqs


def test_pause_in_place_keeps_running_requests_and_runs_nothing():
    env = build()
    reqs = start_three(env)
    outputs = [list(r.output_ids) for r in reqs]
    env.hooks.clear()
    env.s.pause_generation("in_place")
    assert env.hooks == ["on_pause"]
    assert env.s.paused
    num_batches = len(env.runner.batches)
    assert [env.s.step() for _ in range(3)] == [False, False, False]
    assert len(env.runner.batches) == num_batches
    assert env.hooks == ["on_pause"]  # no on_idle while paused
    assert [r.rid for r in env.s.running_batch.reqs] == ["r0", "r1", "r2"]
    assert [r.output_ids for r in reqs] == outputs
    assert env.s.run_until_idle() == 0
    env.s.continue_generation()
    assert not env.s.paused
    env.s.run_until_idle()
    assert_all_done(env, reqs)
    assert env.s.num_retracted == 0


def test_pause_retract_requeues_running_and_chunked_requests():
    env = build(chunked_prefill_size=8)
    reqs = start_three(env)
    long = make_req("long", tokens(30, 700), max_new_tokens=4)
    env.s.submit(long)
    assert env.s.step()
    assert env.s.chunked_req is long
    outputs = {r.rid: list(r.output_ids) for r in reqs}
    env.hooks.clear()
    env.s.pause_generation("retract")
    assert env.hooks == ["on_pause"]
    assert env.s.running_batch.reqs == [] and env.s.chunked_req is None
    assert [r.rid for r in env.s.waiting_queue] == ["r0", "r1", "r2", "long"]
    for req in env.s.waiting_queue:
        assert req.kv_indices == [] and req.is_retracted
        assert req.output_ids == outputs.get(req.rid, [])
    assert env.cache.protected_size() == 0
    assert env.allocator.available_size() + env.cache.total_size() == env.pool
    assert env.s.step() is False
    env.s.continue_generation()
    env.s.run_until_idle()
    assert_all_done(env, [*reqs, long])
    assert env.s.num_retracted == 4


def test_pause_rejects_an_unknown_mode():
    env = build()
    with pytest.raises(ValueError, match="'in_place' or 'retract'"):
        env.s.pause_generation("later")
    assert not env.s.paused


def test_flush_cache_only_when_idle():
    env = build()
    first = make_req("first", tokens(10, 1), max_new_tokens=3)
    env.s.submit(first)
    env.s.step()
    cached = env.cache.total_size()
    assert cached > 0
    assert env.s.flush_cache() is False
    assert env.cache.total_size() == cached
    env.s.run_until_idle()
    assert env.s.flush_cache() is True
    assert env.cache.total_size() == 0
    assert env.allocator.available_size() == env.pool
    again = make_req("again", tokens(10, 1), max_new_tokens=3)
    env.s.submit(again)
    env.s.run_until_idle()
    assert again.cached_tokens == 0


def test_control_requests_are_answered():
    env = build(get_loads=lambda: {"num_running_reqs": 0})
    receiver = env.s.request_receiver
    pause = ControlRequest(type="pause", mode="in_place")
    bad = ControlRequest(type="pause", mode="sideways")
    loads = ControlRequest(type="get_loads")
    receiver.put(make_req("a", tokens(4, 1), max_new_tokens=2))
    receiver.put(pause)
    receiver.put(bad)
    receiver.put(loads)
    assert env.s.step() is False
    assert env.s.paused
    assert pause.replies[0].ok and pause.replies[0].type == "pause"
    assert not bad.replies[0].ok and "'in_place' or 'retract'" in bad.replies[0].message
    assert loads.replies[0].loads == {"num_running_reqs": 0}
    busy_flush = ControlRequest(type="flush")
    receiver.put(busy_flush)
    receiver.put(ControlRequest(type="continue"))
    env.s.run_until_idle()
    assert busy_flush.replies[0].ok is False
    flush = ControlRequest(type="flush")
    receiver.put(flush)
    env.s.step()
    assert flush.replies[0].ok is True
    no_loads = build()
    unanswerable = ControlRequest(type="get_loads")
    no_loads.s.request_receiver.put(unanswerable)
    no_loads.s.step()
    assert unanswerable.replies[0].ok is False


def test_policy_is_swappable_and_lpm_admits_the_cached_prefix_first():
    class Reverse:
        def calc_priority(self, waiting_queue):
            waiting_queue.reverse()

    env = build(policy=Reverse(), max_running_requests=1)
    for i in range(3):
        env.s.submit(make_req(f"r{i}", tokens(4, 10 * i), max_new_tokens=2))
    env.s.run_until_idle()
    assert [b.rids[0] for b in env.runner.prefills()] == ["r2", "r0", "r1"]

    shared = tokens(10, 300)
    orders = {}
    for name in ("fcfs", "lpm"):
        env = build(max_running_requests=1)
        env.s.policy = LPMPolicy(tree_cache=env.cache) if name == "lpm" else FCFSPolicy()
        env.s.submit(make_req("warm", [*shared, 1], max_new_tokens=1))
        env.s.run_until_idle()
        env.s.submit(make_req("cold", tokens(11, 5000), max_new_tokens=1))
        env.s.submit(make_req("hit", [*shared, 2], max_new_tokens=1))
        env.s.run_until_idle()
        orders[name] = [b.rids[0] for b in env.runner.prefills()][1:]
    assert orders == {"fcfs": ["cold", "hit"], "lpm": ["hit", "cold"]}


def test_abort_request_wherever_it_is():
    env = build(chunked_prefill_size=8)
    reqs = start_three(env)
    long = make_req("long", tokens(30, 700), max_new_tokens=4)
    queued = make_req("queued", tokens(4, 800), max_new_tokens=4)
    env.s.submit(long)
    env.s.submit(queued)
    assert env.s.step()
    assert env.s.chunked_req is long
    env.s.abort_request("queued")
    env.s.abort_request("long")
    env.s.abort_request("r1")
    env.s.abort_request("nobody")
    for req in (queued, long, reqs[1]):
        assert req.finished_reason == FinishAbort("aborted")
        assert req.kv_indices == [] and env.streamer.finishes[req.rid] == 1
    assert env.s.chunked_req is None
    assert [r.rid for r in env.s.running_batch.reqs] == ["r0", "r2"]
    env.s.run_until_idle()
    assert env.s.finished_count == 5
    assert env.cache.protected_size() == 0
    assert env.allocator.available_size() + env.cache.total_size() == env.pool
    for req in (reqs[0], reqs[2]):
        assert req.finished_reason == FinishLength(10)


def test_idle_step_runs_on_idle_hooks_and_resets_the_token_ratio():
    env = build(init_new_token_ratio=0.5, min_new_token_ratio=0.1, new_token_ratio_decay_steps=4)
    reqs = start_three(env)  # one prefill and two decode steps
    assert env.s.new_token_ratio == pytest.approx(0.3)
    env.s.step()
    assert env.s.new_token_ratio == pytest.approx(0.2)
    env.s.step()
    env.s.step()
    assert env.s.new_token_ratio == 0.1  # the floor
    env.hooks.clear()
    env.s.run_until_idle()
    assert env.hooks == ["maybe_log_idle_metrics", "publish_kv_events"]
    assert env.s.new_token_ratio == 0.5
    assert env.s.step() is False
    assert_all_done(env, reqs)


def test_serve_runs_until_stopped():
    env = build(sleep_on_idle_seconds=0.001)
    stop = threading.Event()
    thread = threading.Thread(target=env.s.serve, args=(stop,))
    thread.start()
    reqs = [make_req(f"r{i}", tokens(5, 10 * i), max_new_tokens=5) for i in range(4)]
    try:
        for req in reqs:
            env.s.request_receiver.put(req)
        deadline = time.monotonic() + 5
        while env.s.finished_count < 4 and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert_all_done(env, reqs)


@pytest.mark.parametrize("seed", range(12))
def test_random_workloads_finish_exactly_once(seed):
    rng = random.Random(seed)
    page_size = rng.choice([1, 2, 4])
    pool = rng.choice([48, 64, 128, 512]) // page_size * page_size
    chunk = rng.choice([None, 8, 16])
    env = build(
        pool=pool,
        page_size=page_size,
        policy=None,
        max_running_requests=rng.choice([2, 8]),
        max_prefill_tokens=64,
        chunked_prefill_size=chunk,
        init_new_token_ratio=rng.choice([0.0, 0.7]),
        min_new_token_ratio=0.0,
    )
    if seed % 2:
        env.s.policy = LPMPolicy(tree_cache=env.cache)
    prefixes = [tokens(rng.randrange(1, 30), 1000 * k) for k in range(3)]
    reqs = [
        make_req(
            f"r{i}",
            rng.choice(prefixes) + tokens(rng.randrange(1, 20), 50000 + 100 * i),
            max_new_tokens=rng.randrange(1, 30),
        )
        for i in range(25)
    ]
    for req in reqs[:12]:
        env.s.submit(req)
    env.s.run_until_idle(max_steps=6)
    for req in reqs[12:]:
        env.s.submit(req)
    env.s.run_until_idle()

    def fits_pool(req):
        need = len(req.origin_input_ids) + req.sampling_params.max_new_tokens
        return -(-need // page_size) * page_size <= pool

    fits = [r for r in reqs if fits_pool(r)]
    assert_all_done(env, fits, aborted=[r for r in reqs if r not in fits])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"chunked_prefill_size": 0}, "chunked_prefill_size"),
        ({"max_running_requests": 0}, "max_running_requests"),
        ({"min_new_token_ratio": -0.1}, "min_new_token_ratio"),
        ({"init_new_token_ratio": 1.2}, "init_new_token_ratio"),
        ({"schedule_conservativeness": -1.0}, "schedule_conservativeness"),
        ({"context_length": 6}, "context_length must be an integer >= 7"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"pool": 6, "context_length": 4096}, r"KV pool \(6 tokens\) must both be >= 7"),
    ],
)
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        build(**settings)


def test_cache_and_allocator_page_sizes_must_match():
    allocator = TokenToKVPoolAllocator(size=16, page_size=4)
    with pytest.raises(ValueError, match="page_size"):
        Scheduler(
            request_receiver=InprocRequestReceiver(),
            allocator=allocator,
            tree_cache=RadixCache(capacity=16),
            policy=FCFSPolicy(),
            model_runner=SimulatedModelRunner(),
            batch_result_processor=None,
        )


@pytest.mark.parametrize("page_size", [1, 4])
def test_decode_keeps_kv_in_whole_pages_and_a_retraction_step_does_not_decay_the_ratio(
    page_size, monkeypatch
):
    env = build(
        pool=64,
        page_size=page_size,
        max_running_requests=8,
        init_new_token_ratio=0.05,  # admits too many: decode runs out of slots
        min_new_token_ratio=0.0,
        new_token_ratio_decay_steps=10,
        chunked_prefill_size=16,
    )
    reqs = [make_req(f"r{i}", tokens(8, 100 * i), max_new_tokens=24) for i in range(6)]
    for req in reqs:
        env.s.submit(req)
    set_by_retraction = []
    retract, update = Scheduler._retract_decode, Scheduler.update_running_batch

    def record_retract(self):
        retract(self)
        set_by_retraction.append(self.new_token_ratio)

    def checked_update(self):
        before = len(set_by_retraction)
        batch = update(self)
        if len(set_by_retraction) > before:
            assert self.new_token_ratio == set_by_retraction[-1]
        return batch

    monkeypatch.setattr(Scheduler, "_retract_decode", record_retract)
    monkeypatch.setattr(Scheduler, "update_running_batch", checked_update)
    while env.s.step():
        for req in env.s.running_batch.reqs:
            kv = req.kv_indices
            # One slot per token with KV (all but the last one), page by page.
            assert len(kv) == req.num_computed_tokens == req.seqlen - 1
            for i in range(0, len(kv), page_size):
                page = kv[i : i + page_size]
                assert page[0] % page_size == 0
                assert page == list(range(page[0], page[0] + len(page)))
    assert set_by_retraction, "no retraction happened: the pool was large enough"
    assert_all_done(env, reqs)


# SGLang's retraction semantics (scheduler.update_running_batch / ScheduleBatch.retract_decode).


def pressured(page_size=1):
    env = build(
        pool=64,
        page_size=page_size,
        max_running_requests=8,
        init_new_token_ratio=0.0,
        min_new_token_ratio=0.0,
        chunked_prefill_size=16,
    )
    waiting = make_req("waiting", tokens(4, 5000), max_new_tokens=2)
    reqs = [make_req(f"r{i}", tokens(8, 100 * i), max_new_tokens=24) for i in range(6)]
    for req in reqs:
        env.s.submit(req)
    return env, reqs, waiting


def step_until_retraction(env, before=None):
    for _ in range(500):
        if before is not None:
            before()
        if env.s.num_retracted:
            return
        assert env.s.step()
    raise AssertionError("no retraction happened")


def test_retracted_kv_is_freed_not_cached():
    env, reqs, _ = pressured()
    cached_before = []
    step_until_retraction(env, before=lambda: cached_before.append(env.cache.total_size()))
    retracted = [r for r in env.s.waiting_queue if r.is_retracted]
    assert retracted
    for req in retracted:
        # Its generated tokens never entered the cache: a match stops at the prompt.
        key = req.origin_input_ids + req.output_ids
        assert env.cache.match_prefix(key).prefix_len <= len(req.origin_input_ids)
    assert env.cache.total_size() <= cached_before[-1]
    env.s.run_until_idle()
    assert_all_done(env, reqs)


def running_four(env):
    for _ in range(500):
        if len(env.s.running_batch.reqs) >= 4:
            return
        env.s.step()
    raise AssertionError("four requests never ran at once")


def test_retracted_requests_join_the_back_of_the_queue():
    env, reqs, waiting = pressured()
    running_four(env)
    env.s.waiting_queue.append(waiting)
    before = list(env.s.waiting_queue)
    hog = env.allocator.alloc(env.allocator.available_size())  # the pool is full
    env.cache.evict(env.pool)
    env.s._retract_decode()
    queue = env.s.waiting_queue
    assert queue[: len(before)] == before and len(queue) > len(before)
    assert all(r.is_retracted for r in queue[len(before) :])
    env.allocator.free(hog)
    env.s.run_until_idle()
    assert_all_done(env, [*reqs, waiting])


def test_finished_requests_in_the_running_batch_are_not_retracted():
    env, _, _ = pressured()
    running_four(env)
    victim = min(env.s.running_batch.reqs, key=lambda r: len(r.output_ids))
    victim.finished_reason = FinishLength(len(victim.output_ids))  # finished, not yet removed
    env.s._retract_decode()
    assert victim not in env.s.waiting_queue and not victim.is_retracted


def test_out_of_memory_with_one_request_left_aborts_it():
    env = build(pool=32, init_new_token_ratio=0.0, min_new_token_ratio=0.0)
    req = make_req("only", tokens(8, 1), max_new_tokens=24)  # fits the pool on submit
    env.s.submit(req)
    assert env.s.step()  # prefill
    # Something else takes the pool's free slots: the request cannot get its next slot.
    env.allocator.alloc(env.allocator.available_size())
    env.cache.evict(env.pool)
    env.s.step()
    assert isinstance(req.finished_reason, FinishAbort)
    assert "out of memory" in req.finished_reason.message
    assert env.streamer.finishes["only"] == 1
    assert env.s.running_batch.reqs == []


@pytest.mark.parametrize("page_size", [1, 4])
def test_packed_prompts_stay_packed_and_run_as_list_prompts_do(page_size):
    shared = tokens(24, 900)
    prompts = [tokens(5, 7000)] + [[*shared, *tokens(3 + i, 100 * i)] for i in range(6)]

    def run(pack):
        env = build(
            pool=256,
            page_size=page_size,
            max_running_requests=3,
            chunked_prefill_size=16,
        )
        env.s.policy = LPMPolicy(tree_cache=env.cache, in_batch_deprioritize_threshold=8)
        warm = make_req("warm", [*shared, 1], max_new_tokens=1)
        env.s.submit(warm)
        env.s.run_until_idle()  # the shared prefix is cached: LPM orders by what matches
        reqs = [make_req(f"r{i}", p, max_new_tokens=3 + i) for i, p in enumerate(prompts)]
        for req in reqs:
            if pack:
                req.origin_input_ids = array("I", req.origin_input_ids)
            env.s.submit(req)
        assert all(type(r.origin_input_ids) is (array if pack else list) for r in reqs)
        env.s.run_until_idle()
        assert all(type(r.origin_input_ids) is (array if pack else list) for r in reqs)
        assert_all_done(env, [warm, *reqs])
        nodes = env.cache._nodes()
        # What a packed prompt brought into the cache stays packed there.
        assert any(type(n.key) is array for n in nodes) == pack
        tree = sorted((tuple(n.key), tuple(n.value)) for n in nodes)
        return [(b.mode, b.rids, b.prefix_lens, b.extend_lens) for b in env.runner.batches], tree

    assert run(pack=True) == run(pack=False)


def test_schedule_conservativeness_scales_the_new_token_ratio():
    env = build(schedule_conservativeness=0.5)
    assert env.s.new_token_ratio == pytest.approx(0.35)
    assert build(schedule_conservativeness=3.0).s.new_token_ratio == 1.0


def test_retracted_requests_reenter_the_queue_at_the_retraction_time():
    env = build(pool=64, max_running_requests=8, init_new_token_ratio=0.0, min_new_token_ratio=0.0)
    reqs = [make_req(f"r{i}", tokens(8, 100 * i), max_new_tokens=24) for i in range(6)]
    for req in reqs:
        env.s.submit(req)
    for req in reqs:
        req.wait_queue_entry_time = -1.0  # marks the first entry
    while not env.s.num_retracted:
        assert env.s.step()
    retracted = [r for r in env.s.waiting_queue if r.is_retracted]
    assert retracted and all(r.wait_queue_entry_time >= 0.0 for r in retracted)
    # A retraction that keeps nothing estimates 0.0, SGLang's (decoded + 20 * kept) / (max + 1).
    assert env.s.new_token_ratio == pytest.approx(
        min(
            1.0,
            (
                sum(len(r.output_ids) for r in env.s.running_batch.reqs)
                + 20 * len(env.s.running_batch.reqs)
            )
            / (sum(r.sampling_params.max_new_tokens for r in env.s.running_batch.reqs) + 1),
        )
    )


def test_submit_records_entry_time_and_processed_prefill_tokens():
    env = build()
    first = make_req("a", tokens(10, 1))
    env.s.submit(first)
    assert first.arrival_processed_tokens == 0
    env.s.step()  # prefills the 10 prompt tokens
    assert env.s.processed_prefill_tokens == 10
    second = make_req("b", tokens(5, 50))
    env.s.submit(second)
    assert second.arrival_processed_tokens == 10
    assert second.wait_queue_entry_time >= first.wait_queue_entry_time
