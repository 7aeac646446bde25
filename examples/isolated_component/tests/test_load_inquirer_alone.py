"""LoadInquirer on its own: a real allocator and cache, and lambdas for everything the
scheduler and the metrics reporter would bind late."""

from schedkit.components.cache.allocator import TokenToKVPoolAllocator
from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.metrics.reporter import SchedulerStats
from schedkit.components.scheduler.load_inquirer import LoadInquirer
from schedkit.components.scheduler.waiting_queue import WaitingQueue
from schedkit.core.parallel_state import ParallelState
from schedkit.core.schedule_batch import ForwardMode, Req, ScheduleBatch


def _req(rid, prompt_len, prefix_len=0):
    req = Req(rid=rid, origin_input_ids=list(range(prompt_len)))
    req.prefix_len = prefix_len
    return req


def test_loads_count_held_slots_and_waiting_work():
    allocator = TokenToKVPoolAllocator(size=100, page_size=1)
    cache = RadixCache(allocator=allocator, page_size=1)
    running = ScheduleBatch(reqs=[_req("r", 10)], forward_mode=ForwardMode.DECODE)
    waiting = WaitingQueue([_req("w1", 30, prefix_len=20), _req("w2", 5)])
    retracted = _req("w3", 8)
    retracted.is_retracted = True
    chunked = None
    inquirer = LoadInquirer(
        allocator=allocator,
        tree_cache=cache,
        parallel_state=ParallelState(dp_size=2, dp_rank=1),
        get_running_batch=lambda: running,
        get_waiting_queue=lambda: waiting,
        get_stats=lambda: SchedulerStats(gen_throughput=1234.567, cache_hit_rate=0.5),
        get_chunked_req=lambda: chunked,
    )

    held = allocator.alloc(10)  # the running request's KV
    cache.insert(list(range(500, 520)))  # 20 cached tokens nobody holds: evictable
    loads = inquirer.get_loads(include=("memory", "queues"))
    assert loads["num_used_tokens"] == 10  # evictable cache entries count as free
    assert loads["token_usage"] == 0.1
    assert loads["num_total_tokens"] == 10 + 30 + 5
    assert loads["num_waiting_uncached_tokens"] == 10 + 5
    assert (loads["num_running_reqs"], loads["num_waiting_reqs"], loads["dp_rank"]) == (1, 2, 1)
    assert (loads["gen_throughput"], loads["cache_hit_rate"]) == (1234.57, 0.5)
    assert loads["memory"] == {
        "token_capacity": 100,
        "available_tokens": 70,
        "evictable_tokens": 20,
        "protected_tokens": 0,
    }
    assert loads["queues"] == {"waiting": 2, "chunked": 0, "retracted": 0}

    # The getters are read at each call: what the host reassigns is seen at once.
    waiting = WaitingQueue([*waiting, retracted])
    chunked = _req("c", 40)
    chunked.kv_indices = held[:6]  # 6 of its 40 tokens have KV already
    assert inquirer.get_loads(include="queues")["queues"] == {
        "waiting": 3,
        "chunked": 1,
        "retracted": 1,
    }
    assert inquirer.num_pending_tokens(chunk_deduct=4) == 30 + 5 + 8 + (40 - 6 - 4)
