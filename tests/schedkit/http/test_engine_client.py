"""The front end's admission alone, against a real ZeroMQ ROUTER standing in for the scheduler:
requests beyond the forwarded window wait per key and leave in turn, key by key."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import zmq

from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    FinishLength,
    SamplingParamsInput,
    decode_request,
    encode,
)
from schedkit.http.config import Limits
from schedkit.http.engine_client import EngineClient, Overloaded


class Scheduler:
    """A ROUTER that records the rids it receives and finishes requests on demand."""

    def __init__(self) -> None:
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind("tcp://127.0.0.1:0")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.peer = b""
        self.received: list[msgspec.Struct] = []
        self.loads_asked = 0

    async def read(self, count: int) -> None:
        """Until ``count`` messages other than load queries were received."""
        await self.until(lambda: len(self.received) >= count)

    async def until(self, done) -> None:
        """Receive until ``done()``."""
        while not done():
            if self.socket.poll(0):
                self.peer, data = self.socket.recv_multipart()
                msg = decode_request(data)
                if isinstance(msg, ControlReq) and msg.type == "get_loads":
                    self.loads_asked += 1
                else:
                    self.received.append(msg)
            else:
                await asyncio.sleep(0.005)

    def finish(self, rid: str) -> None:
        msg = BatchTokenIDOutput(
            rids=[rid],
            finished_reasons=[FinishLength(1)],
            output_ids=[[9]],
            prompt_tokens=[1],
            completion_tokens=[1],
            cached_tokens=[0],
            cached_tokens_details=[None],
        )
        self.socket.send_multipart([self.peer, encode(msg)])

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def scheduler():
    s = Scheduler()
    yield s
    s.close()


PARAMS = SamplingParamsInput(max_new_tokens=1)


def test_a_flood_from_one_key_does_not_starve_another(scheduler):
    async def run() -> list[str]:
        client = EngineClient(scheduler.endpoint, Limits(max_forwarded_requests=2))
        client.start()
        try:
            flood = [client.submit("flood", [1], PARAMS, f"f{i}") for i in range(6)]
            small = client.submit("small", [1], PARAMS, "s0")
            assert client.admission.forwarded == 2 and client.admission.queued == 5
            order = []
            for _ in range(7):
                await scheduler.read(len(order) + 1)
                rid = scheduler.received[len(order)].rid
                order.append(rid)
                scheduler.finish(rid)
                state = client.states.get(rid)
                if state is not None:
                    await state.wait_done()
            assert all(s.done for s in [*flood, small])
            assert client.admission.forwarded == 0 and client.admission.queued == 0
            return order
        finally:
            client.close()

    order = asyncio.run(run())
    # Two went out at once; the small key's request takes the first freed slot.
    assert order[:3] == ["f0", "f1", "s0"]
    assert sorted(order) == sorted([f"f{i}" for i in range(6)] + ["s0"])


def test_one_key_holds_at_most_its_share_of_the_scheduler(scheduler):
    async def run() -> None:
        client = EngineClient(scheduler.endpoint, Limits(max_forwarded_per_key=2))
        client.start()
        try:
            for i in range(4):
                client.submit("flood", [1], PARAMS, f"f{i}")
            client.submit("small", [1], PARAMS, "s0")
            await scheduler.read(3)
            assert [m.rid for m in scheduler.received] == ["f0", "f1", "s0"]
            assert client.admission.queued == 2
            scheduler.finish("f0")
            await scheduler.read(4)
            assert scheduler.received[3].rid == "f2"
        finally:
            client.close()

    asyncio.run(run())


def test_a_key_leads_the_lightest_key_by_at_most_max_key_lead(scheduler):
    async def run() -> None:
        client = EngineClient(scheduler.endpoint, Limits(max_key_lead=2))
        client.start()
        try:
            client.submit("small", [1], PARAMS, "s0")
            for i in range(4):
                client.submit("flood", [1], PARAMS, f"f{i}")
            await scheduler.read(4)  # s0, f0..f2: the flood may lead by 2, not by 3
            assert [m.rid for m in scheduler.received] == ["s0", "f0", "f1", "f2"]
            assert client.admission.queued == 1
            scheduler.finish("s0")  # alone, the flood has no one to lead
            await scheduler.read(5)
            assert scheduler.received[4].rid == "f3"
        finally:
            client.close()

    asyncio.run(run())


def test_a_key_leads_the_lightest_key_by_at_most_max_key_lead_tokens(scheduler):
    async def run() -> None:
        client = EngineClient(scheduler.endpoint, Limits(max_key_lead_tokens=10))
        client.start()
        try:
            client.submit("small", [1], PARAMS, "s0")
            client.submit("long", list(range(20)), PARAMS, "l0")  # none in flight: it goes
            client.submit("long", list(range(20)), PARAMS, "l1")  # 20 tokens ahead of 1
            await scheduler.read(2)
            assert [m.rid for m in scheduler.received] == ["s0", "l0"]
            assert client.admission.queued == 1
            scheduler.finish("s0")
            await scheduler.read(3)
            assert scheduler.received[2].rid == "l1"
        finally:
            client.close()

    asyncio.run(run())


def test_the_scheduler_queue_is_bounded_in_prompt_tokens_and_polled_while_full(scheduler):
    async def run() -> None:
        limits = Limits(max_scheduler_waiting_tokens=10, load_poll_seconds=0.01)
        client = EngineClient(scheduler.endpoint, limits)
        client.start()
        try:
            for i in range(3):
                client.submit("a", [1, 2, 3, 4], PARAMS, f"r{i}")
            admission = client.admission
            assert admission.forwarded == 2 and admission.queued == 1  # 8 tokens; 12 > 10
            await scheduler.until(lambda: scheduler.loads_asked)  # polled while one waits here
            assert len(scheduler.received) == 2
            loads = {"num_waiting_reqs": 0, "num_waiting_uncached_tokens": 0}
            reply = ControlReply(type="get_loads", ok=True, loads=loads)
            scheduler.socket.send_multipart([scheduler.peer, encode(reply)])
            await scheduler.read(3)
            assert scheduler.received[2].rid == "r2"
            # A prompt over the whole budget still goes, once the scheduler's queue is empty.
            client.admission.loaded(loads, client.admission.sent)
            big = client.submit("b", list(range(20)), PARAMS, "big")
            assert big.forwarded
        finally:
            client.close()

    asyncio.run(run())


@pytest.mark.parametrize("shares", [False, True])
def test_a_key_with_none_in_flight_skips_the_waiting_budgets_when_the_scheduler_shares(
    scheduler, shares
):
    async def run() -> None:
        limits = Limits(max_scheduler_waiting_tokens=10, max_forwarded_requests=4)
        client = EngineClient(scheduler.endpoint, limits, scheduler_shares_keys=shares)
        client.start()
        try:
            a = [client.submit("a", [1, 2, 3, 4], PARAMS, f"a{i}") for i in range(3)]
            assert [s.forwarded for s in a] == [True, True, False]  # 8 tokens; 12 > 10
            b0 = client.submit("b", [1] * 6, PARAMS, "b0")
            assert b0.forwarded is shares  # past the budget only to a scheduler that shares
            b1 = client.submit("b", [1], PARAMS, "b1")
            assert not b1.forwarded  # b now has one in flight (or queued): it waits
            c0 = client.submit("c", [1], PARAMS, "c0")
            d0 = client.submit("d", [1], PARAMS, "d0")
            # The forwarded bounds still hold: a0, a1, b0, c0 fill max_forwarded_requests.
            assert (c0.forwarded, d0.forwarded) == (shares, False)
            await scheduler.read(4 if shares else 2)
            assert [m.rid for m in scheduler.received] == (
                ["a0", "a1", "b0", "c0"] if shares else ["a0", "a1"]
            )
        finally:
            client.close()

    asyncio.run(run())


def test_queues_are_bounded_per_key_and_in_total(scheduler):
    async def run() -> None:
        limits = Limits(max_forwarded_requests=1, max_queued_per_key=2, max_queued=3)
        client = EngineClient(scheduler.endpoint, limits)
        client.start()
        try:
            client.submit("a", [1], PARAMS)  # forwarded
            client.submit("a", [1], PARAMS)
            client.submit("a", [1], PARAMS)
            with pytest.raises(Overloaded) as per_key:
                client.submit("a", [1], PARAMS)
            assert per_key.value.status == 429
            client.submit("b", [1], PARAMS)
            with pytest.raises(Overloaded) as total:
                client.submit("c", [1], PARAMS)
            assert total.value.status == 503
            with pytest.raises(ValueError, match="already in flight"):
                client.submit("a", [1], PARAMS, next(iter(client.states)))
        finally:
            client.close()

    asyncio.run(run())


def test_control_replies_are_matched_in_order_even_after_a_timeout(scheduler):
    async def run() -> None:
        client = EngineClient(scheduler.endpoint, Limits())
        client.start()
        try:
            with pytest.raises(TimeoutError):
                await client.control("get_loads", timeout=0.05)
            second = asyncio.ensure_future(client.control("flush", timeout=5))
            await scheduler.until(lambda: scheduler.loads_asked and scheduler.received)
            for kind in ("get_loads", "flush"):
                reply = ControlReply(type=kind, ok=True)
                scheduler.socket.send_multipart([scheduler.peer, encode(reply)])
            assert (await second).type == "flush"
        finally:
            client.close()

    asyncio.run(run())


def test_an_unqueued_abort_never_reaches_the_scheduler(scheduler):
    async def run() -> None:
        client = EngineClient(scheduler.endpoint, Limits(max_forwarded_requests=1))
        client.start()
        try:
            first = client.submit("a", [1], PARAMS, "r1")
            queued = client.submit("a", [1], PARAMS, "r2")
            client.abort(queued)
            assert queued.done and client.admission.queued == 0
            await scheduler.read(1)
            scheduler.finish("r1")
            await first.wait_done()
            await asyncio.sleep(0.05)
            assert not scheduler.socket.poll(0)
        finally:
            client.close()

    asyncio.run(run())


def test_a_lost_scheduler_ends_every_waiting_request_and_control(scheduler):
    async def run() -> None:
        client = EngineClient(scheduler.endpoint, Limits())
        client.start()
        try:
            state = client.submit("a", [1], PARAMS, "r1")
            await scheduler.read(1)
            control = asyncio.ensure_future(client.control("get_loads", timeout=10))
            await scheduler.until(lambda: scheduler.loads_asked)
            scheduler.socket.close()
            await asyncio.wait_for(state.wait_done(), 10)
            assert state.error.startswith("lost the scheduler connection"), state.error
            with pytest.raises(ConnectionError, match="lost the scheduler connection"):
                await control
        finally:
            client.close()

    asyncio.run(run())
