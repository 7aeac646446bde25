"""RouterNews: what offline workers' steps tell the router, given to it by the steps' end
times; a real Router, fake schedulers (a running batch and a waiting queue)."""

from __future__ import annotations

from types import SimpleNamespace

from schedkit.fleet.router_news import RouterNews
from schedkit.router import Router, make_policy


def worker() -> dict:
    return {"scheduler": SimpleNamespace(running_batch=SimpleNamespace(reqs=[]), waiting_queue=[])}


def test_news_reaches_the_router_by_end_time_and_only_the_last_report_due_counts():
    workers = [worker(), worker()]
    router = Router(range(2), 16, make_policy("round_robin"))
    news = RouterNews(workers, router, channels=[], decode=None)
    router.route(list(range(32)), rid="a")  # round robin: rank 0
    news.routed(0, "a")
    first = SimpleNamespace(rid="a", output_ids=[7])
    workers[0]["scheduler"].running_batch.reqs.append(first)
    news.after_step(0, [], start=0.0, end=1.0)  # "a" got its first token at 1.0
    workers[1]["scheduler"].waiting_queue.extend(["x", "y"])
    news.after_step(1, [], start=0.0, end=0.5)
    workers[1]["scheduler"].waiting_queue.pop()
    news.after_step(1, [], start=0.5, end=0.75)
    workers[1]["scheduler"].waiting_queue.pop()
    news.after_step(1, [], start=0.75, end=2.0)
    assert news.backlog == 4

    news.catch_up(0.9)
    assert router.loads[1].reported_waiting == 1  # the step ending at 0.75, not 0.5 or 2.0
    assert router.loads[0].queued == 1  # the first token at 1.0 is not news yet
    assert news.backlog == 3  # the first token, rank 0's report at 1.0, rank 1's at 2.0

    news.after_step(0, [first], start=1.0, end=1.5)  # "a" ends
    news.catch_up(1.5)
    assert router.loads[0].queued == 0 and router.loads[0].requests == 0
    assert router.loads[1].reported_waiting == 1
    news.catch_up(float("inf"))
    assert router.loads[1].reported_waiting == 0 and news.backlog == 0
