from types import SimpleNamespace

import attrs
import pytest

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.scheduler.load_inquirer import LoadInquirer
from schedkit.components.scheduler.waiting_queue import WaitingQueue
from schedkit.core.component import component_name
from schedkit.core.parallel_state import ParallelState
from schedkit.core.schedule_batch import ForwardMode, Req, ScheduleBatch


class FakeTreeCache:
    def __init__(self, evictable=0, protected=0):
        self.evictable = evictable
        self.protected = protected

    def evictable_size(self):
        return self.evictable

    def protected_size(self):
        return self.protected


def req(rid, prompt_len, output_len=0, prefix_len=0, **fields):
    r = Req(rid=rid, origin_input_ids=list(range(prompt_len)), **fields)
    r.output_ids = list(range(output_len))
    r.prefix_len = prefix_len
    return r


@pytest.fixture
def host():
    """Stands in for the scheduler: the attributes it reassigns at run time."""
    return SimpleNamespace(
        running_batch=ScheduleBatch(reqs=[], forward_mode=ForwardMode.DECODE),
        waiting_queue=WaitingQueue(),
        chunked_req=None,
        stats=SimpleNamespace(gen_throughput=0.0, cache_hit_rate=0.0),
    )


def make_inquirer(host, allocator=None, tree_cache=None, parallel_state=None):
    return LoadInquirer(
        allocator=allocator or TokenToKVPoolAllocator(size=100),
        tree_cache=tree_cache or FakeTreeCache(),
        parallel_state=parallel_state or ParallelState(),
        get_running_batch=lambda: host.running_batch,
        get_waiting_queue=lambda: host.waiting_queue,
        get_stats=lambda: host.stats,
        get_chunked_req=lambda: host.chunked_req,
    )


def test_registered_frozen_component(host):
    assert component_name(LoadInquirer) == "load_inquirer"
    inquirer = make_inquirer(host)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        inquirer.allocator = None


def test_used_tokens_follow_sglang_formula(host):
    allocator = TokenToKVPoolAllocator(size=100)
    allocator.alloc(30)
    inquirer = make_inquirer(host, allocator=allocator, tree_cache=FakeTreeCache(evictable=10))
    assert inquirer.num_used_tokens() == 100 - 70 - 10
    loads = inquirer.get_loads()
    assert loads["num_used_tokens"] == 20
    assert loads["token_usage"] == 0.2


def test_core_loads(host):
    allocator = TokenToKVPoolAllocator(size=64)
    allocator.alloc(16)
    host.running_batch = ScheduleBatch(
        reqs=[req("a", 4, 2), req("b", 4, 1)], forward_mode=ForwardMode.DECODE
    )
    host.waiting_queue = WaitingQueue([req("w1", 10, prefix_len=4), req("w2", 6, output_len=2)])
    host.stats = SimpleNamespace(gen_throughput=123.456, cache_hit_rate=0.33333)
    inquirer = make_inquirer(host, allocator=allocator, tree_cache=FakeTreeCache(evictable=4))
    assert inquirer.get_loads() == {
        "num_running_reqs": 2,
        "num_waiting_reqs": 2,
        "num_used_tokens": 12,
        "token_usage": 0.1875,
        "num_total_tokens": 12 + 10 + 8,
        "num_waiting_uncached_tokens": 6 + 8,
        "gen_throughput": 123.46,
        "cache_hit_rate": 0.3333,
        "dp_rank": 0,
    }


def test_dp_rank_comes_from_parallel_state(host):
    inquirer = make_inquirer(host, parallel_state=ParallelState(dp_rank=3, dp_size=4))
    assert inquirer.get_loads()["dp_rank"] == 3


def test_late_getters_see_reassigned_host_state(host):
    inquirer = make_inquirer(host)
    assert inquirer.get_loads()["num_waiting_reqs"] == 0
    host.waiting_queue = WaitingQueue([req("w", 3)])
    host.running_batch = ScheduleBatch(reqs=[req("r", 2)], forward_mode=ForwardMode.DECODE)
    loads = inquirer.get_loads()
    assert (loads["num_waiting_reqs"], loads["num_running_reqs"]) == (1, 1)


def test_all_sections(host):
    allocator = TokenToKVPoolAllocator(size=32)
    allocator.alloc(8)
    retracted = req("x", 5, is_retracted=True)
    host.waiting_queue = WaitingQueue([retracted, req("y", 5)])
    host.chunked_req = req("c", 50)
    inquirer = make_inquirer(
        host, allocator=allocator, tree_cache=FakeTreeCache(evictable=3, protected=5)
    )
    loads = inquirer.get_loads(include="all")
    assert loads["memory"] == {
        "token_capacity": 32,
        "available_tokens": 24,
        "evictable_tokens": 3,
        "protected_tokens": 5,
    }
    assert loads["speculative"] is None
    assert loads["queues"] == {"waiting": 2, "chunked": 1, "retracted": 1}
    only_memory = inquirer.get_loads(include=["core", "memory"])
    assert "memory" in only_memory and "queues" not in only_memory
    assert "num_running_reqs" in only_memory


def test_unknown_section_is_refused(host):
    with pytest.raises(ValueError, match=r"unknown load section\(s\) 'mem'; valid sections: core"):
        make_inquirer(host).get_loads(include=["mem"])


def test_pending_tokens_include_the_chunked_remainder(host):
    host.waiting_queue = WaitingQueue([req("a", 10), req("b", 5, output_len=3)])
    inquirer = make_inquirer(host)
    assert inquirer.num_pending_tokens() == 18
    chunked = req("c", 100)
    chunked.kv_indices = list(range(40))
    host.chunked_req = chunked
    assert inquirer.num_pending_tokens() == 18 + 60
    assert inquirer.num_pending_tokens(chunk_deduct=25) == 18 + 35


def test_waiting_uncached_tokens_subtract_matched_prefixes(host):
    host.waiting_queue = WaitingQueue(
        [req("a", 10, prefix_len=6), req("b", 4, prefix_len=9), req("c", 3)]
    )
    inquirer = make_inquirer(host)
    assert inquirer.num_waiting_uncached_tokens() == 4 + 0 + 3
    chunked = req("d", 20)
    chunked.kv_indices = list(range(15))
    host.chunked_req = chunked
    assert inquirer.num_waiting_uncached_tokens() == 7 + 5


def test_empty_pool_reports_zero_usage(host):
    inquirer = make_inquirer(host, allocator=TokenToKVPoolAllocator(size=0))
    assert inquirer.get_loads()["token_usage"] == 0.0
