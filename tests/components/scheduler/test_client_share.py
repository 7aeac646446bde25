"""The scheduler's fair shares of the running batch between clients (``client_of``), alone with
a zero-cost runner: one client is never limited, a newcomer retracts another client's surplus
and runs beside its share, and everything still finishes once with no KV leaked."""

from __future__ import annotations

from schedkit.components.scheduler.client_share import ClientShare, context_tokens
from schedkit.core.schedule_batch import ForwardMode
from tests.components.scheduler.test_scheduler import assert_all_done, build, make_req, tokens


def client_of(req) -> str:
    return req.rid[0]  # "a3" is client "a"'s


def flood(n: int, prompt: int = 100, new: int = 30) -> list:
    """Client a's requests, one shared prompt."""
    return [make_req(f"a{i}", tokens(prompt, 1000), max_new_tokens=new) for i in range(n)]


def run(env, reqs) -> list[list[str]]:
    """Submit ``reqs``, step until idle; each prefill batch's rids."""
    for req in reqs:
        env.s.submit(req)
    env.s.run_until_idle()
    return [b.rids for b in env.runner.prefills()]


def test_with_one_client_the_batches_are_sglangs():
    plain, shared = build(pool=4096), build(pool=4096, client_of=client_of, client_share_tokens=1)
    assert run(plain, flood(8)) == run(shared, flood(8))
    assert_all_done(shared, shared.finished)
    assert shared.s.num_retracted == 0


def test_a_newcomer_retracts_another_clients_surplus_and_runs_beside_its_share():
    env = build(pool=4096, client_of=client_of, client_share_tokens=260)
    s, reqs = env.s, flood(6)
    for req in reqs:
        s.submit(req)
    while len(s.running_batch.reqs) < 6:
        s.step()
    small = make_req("b", tokens(10, 50), max_new_tokens=4)
    s.submit(small)
    s.step()  # a keeps its share (130 tokens of context: one request); b is prefilled
    running = [r.rid for r in s.running_batch.reqs]
    assert running == ["a0", "b"], running
    assert [r.rid for r in s.waiting_queue] == ["a5", "a4", "a3", "a2", "a1"]  # newest first
    assert s.num_retracted == 5
    while small.finished_reason is None:
        assert s.step()
        assert [r.rid for r in s.running_batch.reqs if r.rid[0] == "a"] == ["a0"]
        assert env.runner.batches[-1].mode == ForwardMode.DECODE  # nothing of a's admitted
    s.run_until_idle()
    assert_all_done(env, [*reqs, small])


def test_admission_skips_a_client_at_its_share_and_keeps_the_others_order():
    env = build(pool=4096, client_of=client_of, client_share_tokens=100)
    s = env.s
    a = flood(3, prompt=60, new=8)
    b = [make_req(f"b{i}", tokens(20, 5000 + 100 * i), max_new_tokens=8) for i in range(2)]
    s.submit(a[0])
    s.step()  # a0 runs: a is at its share (50) once b waits
    for req in [a[1], b[0], a[2], b[1]]:
        s.submit(req)
    s.step()
    assert env.runner.prefills()[-1].rids == ["b0", "b1"]
    assert [r.rid for r in s.waiting_queue] == ["a1", "a2"]
    s.run_until_idle()
    assert_all_done(env, [*a, *b])


def test_plan_counts_context_and_keeps_one_request_per_client():
    reqs = flood(3, prompt=40, new=8)
    for req in reqs:
        req.output_ids = [7] * 5
    share = ClientShare(client_of=client_of, share_tokens=40)
    small = make_req("b", tokens(4, 9), max_new_tokens=2)
    assert context_tokens(reqs[0]) == 45
    assert share.plan(reqs, None, [small]) == [reqs[2], reqs[1]]  # 45 > 40 / 2, one kept
    assert share.plan(reqs, None, reqs[:1]) == []  # one client: no share


def test_a_heavier_clients_requests_wait_while_a_lighter_client_runs():
    env = build(pool=4096, client_of=client_of, client_share_tokens=1 << 20)
    s = env.s
    a = flood(4, prompt=60, new=12)
    s.submit(a[0])
    s.step()  # a0 runs
    small = make_req("b", tokens(10, 50), max_new_tokens=6)
    for req in [a[1], small, a[2], a[3]]:
        s.submit(req)
    s.step()
    assert env.runner.prefills()[-1].rids == ["b"]  # lightest first, and alone
    while small.finished_reason is None:
        assert s.step()
        assert env.runner.batches[-1].mode == ForwardMode.DECODE  # a's wait meanwhile
    s.run_until_idle()
    assert env.runner.prefills()[-1].rids == ["a1", "a2", "a3"]
    assert_all_done(env, [*a, small])


def test_a_heavier_clients_chunked_prefill_pauses_while_a_lighter_client_runs():
    env = build(pool=4096, client_of=client_of, chunked_prefill_size=64)
    s = env.s
    long = make_req("a0", tokens(256, 1000), max_new_tokens=4)
    s.submit(long)
    s.step()  # its first chunk
    assert s.chunked_req is long
    small = make_req("b", tokens(10, 50), max_new_tokens=4)
    s.submit(small)
    while small.finished_reason is None:
        assert s.step()
        assert "a0" not in env.runner.batches[-1].rids  # its chunks wait for b
    assert s.chunked_req is long
    s.run_until_idle()
    assert [b.extend_lens for b in env.runner.prefills() if b.rids == ["a0"]] == [[64]] * 4
    assert_all_done(env, [long, small])
