"""The fleet gateway alone: real ZeroMQ sockets on loopback stand for its client (the HTTP front
end's DEALER) and its two workers (ROUTERs, as a worker's ``zmq_server`` is); no worker process
is started."""

from __future__ import annotations

import pytest
import zmq

from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    ErrorReply,
    GenerateReqInput,
    SamplingParamsInput,
    decode_request,
    decode_server_message,
    encode,
)
from schedkit.core.schedule_batch import FinishAbort, FinishLength
from schedkit.fleet.gateway import FleetGateway
from schedkit.router import Router, make_policy
from tests.components.io.test_output_sender import token_msg
from tests.schedkit.fleet.test_live import WIRING

TIMEOUT_MS = 10_000


class Rig:
    """A gateway wired to real sockets: ``clients`` (DEALERs) and ``workers`` (ROUTERs)."""

    def __init__(self, num_clients: int = 1) -> None:
        gateway = self.gateway = FleetGateway(
            WIRING, 2, "round_robin", endpoint="tcp://127.0.0.1:0", cap_workers=False
        )
        gateway.router = Router(range(2), 16, make_policy("round_robin"))
        context = gateway._context
        server = gateway._server = context.socket(zmq.ROUTER)
        server.bind("tcp://127.0.0.1:0")
        endpoint = server.getsockopt_string(zmq.LAST_ENDPOINT)
        self.clients = []
        for _ in range(num_clients):
            client = context.socket(zmq.DEALER)
            client.connect(endpoint)
            self.clients.append(client)
        self.workers = []
        for _ in range(2):
            worker = context.socket(zmq.ROUTER)
            worker.bind("tcp://127.0.0.1:0")
            dealer = context.socket(zmq.DEALER)
            dealer.connect(worker.getsockopt_string(zmq.LAST_ENDPOINT))
            gateway._dealers.append(dealer)
            gateway._poller.register(dealer, zmq.POLLIN)
            self.workers.append(worker)
        self._peers: list[bytes | None] = [None, None]

    def send(self, client: int, msg) -> None:
        """Client ``client`` sends ``msg``; the gateway takes it in."""
        self.clients[client].send(encode(msg))
        assert self.gateway._server.poll(TIMEOUT_MS)
        self.gateway._take_requests()

    def worker_gets(self, rank: int):
        """What worker ``rank`` received next."""
        assert self.workers[rank].poll(TIMEOUT_MS)
        peer, payload = self.workers[rank].recv_multipart()
        self._peers[rank] = peer
        return decode_request(payload)

    def worker_sends(self, rank: int, msg) -> None:
        """Worker ``rank`` answers; the gateway takes it in."""
        self.workers[rank].send_multipart([self._peers[rank], encode(msg)])
        dealer = self.gateway._dealers[rank]
        assert dealer.poll(TIMEOUT_MS)
        self.gateway._receive(rank, dealer.recv(), 0.5)

    def client_gets(self, client: int = 0):
        """What client ``client`` received next."""
        assert self.clients[client].poll(TIMEOUT_MS)
        return decode_server_message(self.clients[client].recv())

    def client_has_nothing(self, client: int = 0) -> bool:
        return not self.clients[client].poll(100)

    def close(self) -> None:
        for sock in [*self.clients, *self.workers]:
            sock.close(linger=0)
        self.gateway.close()


@pytest.fixture
def rig():
    rig = Rig(num_clients=2)
    yield rig
    rig.close()


def generate(rid: str, tokens: int = 20, **params) -> GenerateReqInput:
    return GenerateReqInput(
        rid=rid,
        input_ids=list(range(1, tokens + 1)),
        sampling_params=SamplingParamsInput(**params),
    )


def test_a_request_goes_to_a_worker_as_sent_but_streamed_and_its_outputs_come_back(rig):
    rig.send(0, generate("a", max_new_tokens=3, min_new_tokens=2, stream=False))
    sent = rig.worker_gets(0)
    assert sent.rid == "a" and sent.input_ids == list(range(1, 21))
    assert sent.sampling_params == SamplingParamsInput(
        max_new_tokens=3, min_new_tokens=2, stream=True
    )
    rig.worker_sends(0, token_msg(("a", [7], None)))
    assert rig.client_gets() == token_msg(("a", [7], None))
    rig.worker_sends(0, token_msg(("a", [8, 9], FinishLength(length=3))))
    assert rig.client_gets() == token_msg(("a", [8, 9], FinishLength(length=3)))
    gateway = rig.gateway
    assert gateway.outcomes["done"] == [1, 0] and gateway.routed == [1, 0]
    assert (gateway.prompt_tokens, gateway.generated_tokens) == ([4, 0], [2, 0])
    assert gateway._clients == {} and gateway._messages == {}


def test_one_worker_message_for_two_clients_is_split_between_them(rig):
    rig.send(0, generate("a"))
    rig.send(1, generate("b"))
    rig.send(0, generate("c"))
    assert [rig.worker_gets(0).rid, rig.worker_gets(1).rid, rig.worker_gets(0).rid] == [
        "a",
        "b",
        "c",
    ]
    msg = token_msg(("a", [1], None), ("c", [2], FinishLength(length=1)))
    msg.load = {"num_waiting_reqs": 9}
    rig.worker_sends(0, msg)
    got = rig.client_gets(0)
    assert isinstance(got, BatchTokenIDOutput) and got.rids == ["a", "c"]
    # A worker's own load is not the fleet's: the fleet's replaces it (after "c" ended and
    # "a" got its first token; "b" has none yet), and the worker is named.
    assert got.load["num_waiting_reqs"] == 1 and got.load["num_running_reqs"] == 1
    assert got.dp_rank == 0
    assert rig.client_has_nothing(1)
    rig.worker_sends(1, token_msg(("b", [3], None)))
    assert rig.client_gets(1).rids == ["b"]


def test_outputs_from_a_worker_the_request_was_not_sent_to_are_not_relayed(rig):
    rig.send(0, generate("a"))
    rig.worker_gets(0)
    # Worker 1 never got "a" but sends an output for it.
    rig.gateway._receive(1, encode(token_msg(("a", [5], FinishLength(length=1)))), 0.5)
    assert rig.client_has_nothing()
    assert "a" in rig.gateway._inflight


def test_a_worker_refusal_reaches_the_client_as_an_error_naming_the_worker(rig):
    rig.send(0, generate("a"))
    rig.worker_gets(0)
    rig.worker_sends(0, ErrorReply(message="over max_waiting_requests", rid="a"))
    reply = rig.client_gets()
    assert reply == ErrorReply(message="worker 0: over max_waiting_requests", rid="a")
    assert rig.gateway.outcomes["refused"] == [1, 0]


def test_a_rid_already_in_flight_is_refused(rig):
    rig.send(0, generate("a"))
    rig.send(1, generate("a"))
    reply = rig.client_gets(1)
    assert isinstance(reply, ErrorReply) and reply.rid == "a" and "in flight" in reply.message


def test_control_replies_keep_their_order_while_a_pause_waits_for_every_worker(rig):
    rig.send(0, ControlReq(type="pause", mode="in_place"))
    rig.send(0, ControlReq(type="get_loads"))
    paused = [rig.worker_gets(rank) for rank in range(2)]
    assert {p.type for p in paused} == {"pause"} and {p.mode for p in paused} == {"in_place"}
    assert {p.token for p in paused} == {rig.gateway.admin_token}
    assert rig.client_has_nothing()  # the load reply waits behind the pause
    rig.worker_sends(0, ControlReply(type="pause", ok=True))
    assert rig.client_has_nothing()
    rig.gateway._mark_dead(1, "no heartbeat for 1 s")
    first, second = rig.client_gets(), rig.client_gets()
    assert first.type == "pause" and not first.ok
    assert first.message == "worker 1 was taken out: no heartbeat for 1 s"
    assert second.type == "get_loads" and second.ok
    assert second.loads["num_workers"] == 1


def test_get_loads_counts_requests_before_and_after_their_first_token(rig):
    for rid in "abc":
        rig.send(0, generate(rid))
    rig.worker_gets(0)
    rig.worker_sends(0, token_msg(("a", [1], None)))
    rig.client_gets()
    rig.send(0, ControlReq(type="get_loads"))
    loads = rig.client_gets().loads
    assert (loads["num_running_reqs"], loads["num_waiting_reqs"]) == (1, 2)
    assert loads["num_total_tokens"] == 60
    assert loads["num_waiting_uncached_tokens"] == 40  # whole prompts: an upper bound


def test_an_abort_reaches_the_worker_and_the_request_ends_as_aborted(rig):
    rig.send(0, generate("a"))
    rig.worker_gets(0)
    rig.send(0, ControlReq(type="abort", rid="a"))
    assert rig.client_gets() == ControlReply(type="abort", ok=True)
    assert rig.worker_gets(0) == ControlReq(type="abort", rid="a")
    rig.worker_sends(0, token_msg(("a", [], FinishAbort(message="aborted"))))
    rig.client_gets()  # its last output, which the front end drops
    gateway = rig.gateway
    assert gateway.outcomes["aborted"] == [1, 0] and gateway.outcomes["failed"] == [0, 0]
    assert gateway._inflight == {} and gateway._withdrawn == set()
