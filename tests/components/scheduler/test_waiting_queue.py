"""WaitingQueue keeps exact totals: checked against a walk over the queue after every change,
for random sequences of list operations and for the scheduler under random workloads."""

import copy
import pickle
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.io.request_receiver import InprocRequestReceiver
from schedkit.components.scheduler.batch_result_processor import BatchResultProcessor
from schedkit.components.scheduler.load_inquirer import LoadInquirer
from schedkit.components.scheduler.schedule_policy import FCFSPolicy, LPMPolicy
from schedkit.components.scheduler.scheduler import Scheduler
from schedkit.components.scheduler.waiting_queue import WaitingQueue
from schedkit.core.parallel_state import ParallelState
from schedkit.core.schedule_batch import Req, SamplingParams
from schedkit.runner.model_runner import SimulatedModelRunner


def walked(queue):
    """The totals as a walk over the queue computes them."""
    return (
        sum(r.seqlen for r in queue),
        sum(max(0, r.seqlen - r.prefix_len) for r in queue),
        sum(1 for r in queue if r.is_retracted),
    )


def totals(queue):
    return queue.num_tokens, queue.num_uncached_tokens, queue.num_retracted


def new_req(i, prompt, output, prefix, retracted):
    req = Req(rid=f"r{i}", origin_input_ids=[7] * prompt)
    req.output_ids = [1] * output
    req.prefix_len = prefix
    req.is_retracted = retracted
    return req


reqs = st.builds(
    new_req,
    st.integers(0, 10**6),
    st.integers(1, 60),
    st.integers(0, 20),
    st.integers(0, 90),
    st.booleans(),
)
ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "append",
                "extend",
                "iadd",
                "insert",
                "pop",
                "remove",
                "del_index",
                "del_slice",
                "set_index",
                "set_slice",
                "admit",
                "lpm_sort",
                "reverse",
                "clear",
            ]
        ),
        st.integers(0, 50),
        st.lists(reqs, max_size=4),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(start=st.lists(reqs, max_size=8), operations=ops)
def test_totals_match_a_walk_after_every_operation(start, operations):
    queue = WaitingQueue(start)
    assert totals(queue) == walked(queue)
    for op, n, fresh in operations:
        i = n % len(queue) if queue else 0
        if op == "append" and fresh:
            queue.append(fresh[0])
        elif op == "extend":
            queue.extend(iter(fresh))  # a one-shot iterator is consumed once
        elif op == "iadd":
            queue += fresh
        elif op == "insert" and fresh:
            queue.insert(n, fresh[0])
        elif op == "pop" and queue:
            queue.pop(i)
        elif op == "remove" and queue:
            queue.remove(queue[i])
        elif op == "del_index" and queue:
            del queue[i]
        elif op == "del_slice":
            del queue[i : i + n % 5]
        elif op == "set_index" and queue and fresh:
            queue[i] = fresh[0]
        elif op == "set_slice":
            queue[i : i + n % 3] = fresh
        elif op == "admit":
            # Admission sets prefix_len on the requests it takes, then deletes them.
            for req in queue[: n % 4]:
                req.prefix_len = n
            del queue[: n % 4]
        elif op == "lpm_sort":
            # LPM stores each request's match in prefix_len, then sorts.
            for k, req in enumerate(queue):
                req.prefix_len = (n * (k + 1)) % 70
            queue.sort(key=lambda r: -r.prefix_len)
        elif op == "reverse":
            queue.reverse()
        elif op == "clear":
            queue.clear()
        assert totals(queue) == walked(queue), op
    assert isinstance(queue, list)


def test_copies_and_pickles_count_afresh():
    queue = WaitingQueue([new_req(1, 5, 1, 2, True), new_req(2, 7, 0, 0, False)])
    for other in (copy.copy(queue), copy.deepcopy(queue), pickle.loads(pickle.dumps(queue))):
        assert type(other) is WaitingQueue and totals(other) == totals(queue) == walked(other)
        other.pop()
        assert totals(other) == walked(other) and totals(queue) == walked(queue)


def test_a_copy_is_a_plain_list_and_multiplying_recounts():
    queue = WaitingQueue([new_req(1, 5, 0, 2, True)])
    assert type(queue.copy()) is list
    queue *= 3
    assert totals(queue) == (15, 9, 3) == walked(queue)


class Streamer:
    def stream_output(self, reqs, return_logprob=False, skip_req=None):
        for req in reqs:
            if req.finished_reason is not None and req is not skip_req:
                req.finished_output = True


def scheduler_env(pool, lpm_limit):
    allocator = TokenToKVPoolAllocator(size=pool, page_size=1)
    cache = RadixCache(allocator=allocator, page_size=1)
    runner = SimulatedModelRunner(zero_cost=True, seed=3)
    host = {}
    processor = BatchResultProcessor(
        tree_cache=cache,
        output_streamer=Streamer(),
        eos_token_id=runner.eos_token_id,
        abort_request=lambda rid: host["s"].abort_request(rid),
    )
    policy = (
        FCFSPolicy()
        if lpm_limit is None
        else LPMPolicy(tree_cache=cache, max_queue_for_prefix_match=lpm_limit)
    )
    s = Scheduler(
        request_receiver=InprocRequestReceiver(),
        allocator=allocator,
        tree_cache=cache,
        policy=policy,
        model_runner=runner,
        batch_result_processor=processor,
        now=runner.now,
        max_running_requests=6,
        chunked_prefill_size=32,
        max_prefill_tokens=64,
    )
    host["s"] = s
    inquirer = LoadInquirer(
        allocator=allocator,
        tree_cache=cache,
        parallel_state=ParallelState(),
        get_running_batch=lambda: s.running_batch,
        get_waiting_queue=lambda: s.waiting_queue,
        get_stats=lambda: SimpleNamespace(gen_throughput=0.0, cache_hit_rate=0.0),
        get_chunked_req=lambda: s.chunked_req,
    )
    return s, inquirer


def check_loads(s, inquirer):
    queue = s.waiting_queue
    assert totals(queue) == walked(queue)
    loads = inquirer.get_loads("all")
    tokens, uncached, retracted = walked(queue)
    chunked = s.chunked_req
    left = 0 if chunked is None else chunked.seqlen - len(chunked.kv_indices)
    assert loads["num_total_tokens"] == inquirer.num_used_tokens() + tokens
    assert loads["num_waiting_uncached_tokens"] == uncached + max(0, left)
    assert loads["queues"]["retracted"] == retracted
    assert inquirer.num_pending_tokens() == tokens + left


events = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.integers(0, 3),  # shared-prefix group
            st.integers(1, 40),  # own tokens
            st.integers(1, 24),  # max_new_tokens
        ),
        st.tuples(st.just("step"), st.integers(1, 6)),
        st.tuples(st.just("step"), st.integers(1, 6)),
        st.tuples(st.just("abort"), st.integers(0, 60)),
        st.tuples(st.just("pause_retract")),
    ),
    min_size=4,
    max_size=60,
)


@settings(max_examples=120, deadline=None)
@given(
    script=events,
    pool=st.integers(120, 400),
    lpm_limit=st.sampled_from([None, 0, 4, 128]),
)
def test_scheduler_queue_totals_stay_exact_under_random_workloads(script, pool, lpm_limit):
    s, inquirer = scheduler_env(pool, lpm_limit)
    submitted = 0
    for event in script:
        kind = event[0]
        if kind == "submit":
            _, group, own, new = event
            prompt = [100 + group] * 24 + list(range(submitted * 50, submitted * 50 + own))
            s.submit(
                Req(
                    rid=f"q{submitted}",
                    origin_input_ids=prompt,
                    sampling_params=SamplingParams(max_new_tokens=new, ignore_eos=True),
                )
            )
            submitted += 1
        elif kind == "step":
            for _ in range(event[1]):
                s.step()
                check_loads(s, inquirer)
        elif kind == "abort":
            s.abort_request(f"q{event[1]}")
        else:
            s.pause_generation("retract")
            check_loads(s, inquirer)
            s.continue_generation()
        check_loads(s, inquirer)
    s.run_until_idle(max_steps=5000)
    check_loads(s, inquirer)
    assert not s.waiting_queue and totals(s.waiting_queue) == (0, 0, 0)


def test_mean_wait_follows_every_change_of_the_queue():
    q = WaitingQueue()
    assert q.mean_wait(5.0) == 0.0
    a = Req(rid="a", origin_input_ids=[1], wait_queue_entry_time=1.0)
    b = Req(rid="b", origin_input_ids=[1], wait_queue_entry_time=3.0)
    q.append(a)
    q.extend([b])
    assert q.mean_wait(5.0) == pytest.approx(((5 - 1) + (5 - 3)) / 2)
    del q[:1]
    assert q.mean_wait(5.0) == pytest.approx(2.0)
    q.remove(b)
    assert q.mean_wait(5.0) == 0.0 and q.entry_time_sum == 0.0
    assert WaitingQueue([a]).mean_wait(0.5) == 0.0  # never negative
