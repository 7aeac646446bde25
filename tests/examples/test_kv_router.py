"""The KV-aware router example: routing decisions over real publishers on free loopback ports."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schedkit.kv_events import (
    BlockStored,
    KVEventBatch,
    KvEventsConfig,
    PublisherRestarted,
    ZmqEventPublisher,
    page_hashes,
)
from schedkit.testing import cache_page_hashes

ROUTER = Path(__file__).resolve().parents[2] / "examples" / "kv_router" / "router.py"
spec = importlib.util.spec_from_file_location("kv_router_example", ROUTER)
router = importlib.util.module_from_spec(spec)
spec.loader.exec_module(router)


def test_demo_routes_by_prefix_then_by_load():
    lines: list[str] = []
    decisions = router.run_demo(out=lines.append)
    got = [(name, r.rank, r.matched_pages, r.tie_break) for name, r in decisions]
    assert got == [
        ("system A + question", 0, 4, False),
        ("system B + question", 1, 4, False),
        ("new prompt C", 0, 0, True),  # equal loads: the rank chosen least recently
        ("new prompt D", 1, 0, True),  # rank 0 now has one more request
        ("new prompt E", 1, 0, True),  # rank 0 reported 8 busy requests, rank 1 one
        ("first half of system A", 0, 2, False),  # a cached prefix beats load
        ("system A again", 1, 0, True),  # rank 0 evicted its pages
    ]
    assert decisions[0][1].scores == {0: 4, 1: 0}
    assert "index: rank 0 holds 10 pages, rank 1 holds 10" in lines
    assert "rank 0 evicted everything: it holds 0 pages" in lines


def test_demo_as_a_script():
    result = subprocess.run(
        [sys.executable, str(ROUTER)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    routes = [line.split("->")[1].split()[1] for line in result.stdout.splitlines() if "->" in line]
    assert routes == ["0", "1", "0", "1", "1", "0", "1"]


def test_rank_endpoints_follow_the_publishers_port_offsets():
    assert router.rank_endpoints("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5600", 2) == {
        0: ("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5600"),
        1: ("tcp://127.0.0.1:5558", "tcp://127.0.0.1:5601"),
    }
    assert router.rank_endpoints("ipc:///tmp/kv", None, 1) == {0: ("ipc:///tmp/kv_dp0", None)}


def stored(tokens: list[int]) -> KVEventBatch:
    (h,) = page_hashes(tokens, len(tokens))
    return KVEventBatch(ts=0.0, events=[BlockStored([h], None, tokens, len(tokens), None, "GPU")])


def test_a_publisher_restart_clears_the_rank():
    port, replay = router.free_port_bases(2)
    config = KvEventsConfig(
        endpoint=f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{replay}"
    )
    kv = router.KvRouter(router.rank_endpoints(config.endpoint, config.replay_endpoint, 1), 4)
    first = second = None
    try:
        first = ZmqEventPublisher(config)
        deadline = time.monotonic() + 5
        while kv.subscribers[0].last_seq is None:  # publish until the subscription is live
            assert time.monotonic() < deadline
            first.publish(stored([1, 2, 3, 4]))
            kv.poll(20)
        for _ in range(200):  # so that the next publisher's seqs start well below
            first.publish(KVEventBatch(ts=0.0, events=[]))
        first.flush()
        kv.sync(lambda r: r.subscribers[0].last_seq == first.last_seq)
        assert kv.route([1, 2, 3, 4]).matched_pages == 1
        first.shutdown()

        # The new publisher sends no AllBlocksCleared: only the restart drops the old block.
        second = ZmqEventPublisher(config)

        def restarted(r) -> bool:
            second.publish(stored([5, 6, 7, 8]))
            return any(isinstance(n, PublisherRestarted) for _, n in r.notices)

        kv.sync(restarted, timeout=10)
        kv.sync(lambda r: r.index.blocks(0))
        assert kv.index.blocks(0) == set(page_hashes([5, 6, 7, 8], 4))
        assert kv.route([1, 2, 3, 4]).matched_pages == 0
        assert kv.route([5, 6, 7, 8]).matched_pages == 1
    finally:
        kv.close()
        for pub in (first, second):
            if pub is not None:
                pub.shutdown()


@pytest.mark.parametrize("seed", [0, 1])
def test_two_schedulers_keep_each_prompt_family_on_the_rank_that_cached_it(seed):
    requests = router.family_requests(families="ABC", per_family=4, system_len=256, seed=seed)
    lines: list[str] = []
    run = router.run_schedulers(out=lines.append, requests=requests)

    assert [s.req for s in run.served] == [req for _, req in requests]
    page_size = run.caches[0].page_size
    assert page_size == 16  # the default wiring's allocator.page_size
    first_rank: dict[str, int] = {}
    for served in run.served:
        req, route = served.req, served.route
        assert len(req.output_ids) == 8, req.rid
        if served.family not in first_rank:
            first_rank[served.family] = route.rank
            assert (route.matched_pages, req.cached_tokens) == (0, 0), req.rid
        else:
            assert route.rank == first_rank[served.family], req.rid
            # The router hashed the whole system prompt as the chosen rank's cache did.
            assert route.matched_pages == 256 // page_size, req.rid
            assert req.cached_tokens == 256, req.rid
    assert sorted(first_rank) == ["A", "B", "C"]
    assert set(first_rank.values()) == {0, 1}  # both ranks got work

    for rank, cache in enumerate(run.caches):
        held = cache_page_hashes(cache)
        assert held
        assert run.index.blocks(rank) == held
    assert len(lines) == len(requests) + 2
    assert lines[-2].startswith("rank 0: ") and lines[-1].startswith("rank 1: ")


def test_two_schedulers_as_a_script():
    result = subprocess.run(
        [sys.executable, str(ROUTER), "--schedulers"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sum("->" in line for line in lines) == 12
    assert lines[-2].startswith("rank 0: ") and lines[-1].startswith("rank 1: ")


def test_two_schedulers_take_no_endpoint(capsys):
    with pytest.raises(SystemExit) as exit_info:
        router.main(["--schedulers", "--endpoint", "tcp://127.0.0.1:5557"])
    assert exit_info.value.code == 2
    assert "--schedulers runs its own schedulers; leave out --endpoint" in capsys.readouterr().err
