import re
from array import array

import msgspec
import pytest

from schedkit.components.io.io_struct import (
    BatchEmbeddingOutput,
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    ControlRequest,
    GenerateReqInput,
    SamplingParamsInput,
    check_endpoint,
    decode_output,
    decode_reply,
    decode_request,
    encode,
    rid_of,
)
from schedkit.core.schedule_batch import FinishAbort, FinishLength, FinishMatchedToken, Req


def test_generate_request_round_trips_and_converts_to_req():
    msg = GenerateReqInput(
        rid="r1",
        input_ids=[5, 6, 7],
        sampling_params=SamplingParamsInput(
            max_new_tokens=4, stop_token_ids=[9], stream=True, stream_interval=2
        ),
    )
    decoded = decode_request(encode(msg))
    assert decoded == msg
    req = decoded.to_req()
    assert isinstance(req, Req)
    assert (req.rid, req.origin_input_ids) == ("r1", array("I", [5, 6, 7]))  # packed
    params = req.sampling_params
    assert (params.max_new_tokens, tuple(params.stop_token_ids)) == (4, (9,))
    assert (params.stream, params.stream_interval, params.ignore_eos) == (True, 2, False)
    assert params.validation_error() is None


def test_sampling_params_default_when_omitted():
    data = msgspec.msgpack.encode({"kind": "generate", "rid": "a", "input_ids": [1]})
    req = decode_request(data).to_req()
    assert req.sampling_params.max_new_tokens == 128
    assert not req.sampling_params.stream


def test_control_request_decodes_with_default_mode():
    data = msgspec.msgpack.encode({"kind": "control", "type": "pause"})
    assert decode_request(data) == ControlReq(type="pause", mode="retract")
    assert decode_request(encode(ControlReq(type="get_loads"))).type == "get_loads"


@pytest.mark.parametrize(
    "payload, problem",
    [
        ({"kind": "generate", "rid": "a", "input_ids": [-1]}, "$.input_ids[0]"),
        ({"kind": "generate", "rid": "", "input_ids": [1]}, "$.rid"),
        ({"kind": "generate", "rid": "a", "input_ids": []}, "$.input_ids"),
        (
            {
                "kind": "generate",
                "rid": "a",
                "input_ids": [1],
                "sampling_params": {"max_new_tokens": 0},
            },
            "$.sampling_params.max_new_tokens",
        ),
        (
            {"kind": "generate", "rid": "a", "input_ids": [1], "sampling_params": {"top_k": 3}},
            "top_k",
        ),
        ({"kind": "control", "type": "explode"}, "$.type"),
        ({"kind": "control", "type": "pause", "mode": "sideways"}, "$.mode"),
        ({"kind": "telepathy"}, "$.kind"),
    ],
)
def test_invalid_requests_name_the_field(payload, problem):
    with pytest.raises(msgspec.ValidationError, match=re.escape(problem)):
        decode_request(msgspec.msgpack.encode(payload))


def test_token_output_round_trips_every_finish_reason_and_details():
    msg = BatchTokenIDOutput(
        rids=["a", "b", "c", "d"],
        finished_reasons=[None, FinishLength(3), FinishMatchedToken(2), FinishAbort("too long")],
        output_ids=[[1], [2, 3], [], [4]],
        prompt_tokens=[5, 5, 5, 5],
        completion_tokens=[1, 3, 1, 1],
        cached_tokens=[0, 2, 0, 0],
        cached_tokens_details=[
            None,
            {"device": 2, "host": 0},
            {"device": 1, "host": 1, "storage": 0, "storage_backend": "none"},
            None,
        ],
        dp_rank=1,
        load={"num_running_reqs": 3},
    )
    decoded = decode_output(encode(msg))
    assert decoded == msg
    assert isinstance(decoded.finished_reasons[3], FinishAbort)


def test_embedding_output_round_trips():
    msg = BatchEmbeddingOutput(
        rids=["e"],
        finished_reasons=[FinishLength(0)],
        prompt_tokens=[3],
        cached_tokens=[0],
        cached_tokens_details=[None],
        embeddings=[[0.5, -1.0]],
    )
    assert decode_output(encode(msg)) == msg


def test_control_request_reply_forms():
    sent = []
    control = ControlRequest(type="get_loads", send_reply=sent.append)
    loads = control.reply({"num_running_reqs": 2})
    assert loads == ControlReply(type="get_loads", ok=True, loads={"num_running_reqs": 2})
    flush = ControlRequest(type="flush", send_reply=sent.append)
    assert flush.reply(False) == ControlReply(type="flush", ok=False, message="flush failed")
    assert flush.reply(True).ok
    assert ControlRequest(type="pause").reply() == ControlReply(type="pause", ok=True)
    assert sent == [loads, *flush.replies]
    assert decode_reply(encode(loads)) == loads
    with pytest.raises(TypeError, match="ControlReply, a loads dict, a bool or None"):
        control.reply("yes")


@pytest.mark.parametrize(
    "endpoint", ["tcp://127.0.0.1:0", "tcp://127.0.0.5:5555", "tcp://[::1]:*", "ipc:///tmp/x"]
)
def test_check_endpoint_accepts_loopback_binds(endpoint):
    assert check_endpoint(endpoint, bind=True) == endpoint


def test_check_endpoint_refuses_remote_binds_unless_allowed():
    with pytest.raises(ValueError, match=r"not a loopback address.*allow_remote"):
        check_endpoint("tcp://0.0.0.0:5555", bind=True)
    assert check_endpoint("tcp://0.0.0.0:5555", bind=True, allow_remote=True)
    assert check_endpoint("tcp://10.1.2.3:5555", bind=False)


@pytest.mark.parametrize(
    "endpoint, problem",
    [
        ("udp://127.0.0.1:1", "unsupported endpoint"),
        ("tcp://127.0.0.1", "needs host and port"),
        ("tcp://127.0.0.1:99999", "bad port"),
        ("tcp://127.0.0.1:http", "bad port"),
    ],
)
def test_check_endpoint_rejects_bad_endpoints(endpoint, problem):
    with pytest.raises(ValueError, match=problem):
        check_endpoint(endpoint, bind=False)


def test_rid_of_reads_only_the_rid_and_survives_hostile_frames():
    assert rid_of(msgspec.msgpack.encode({"kind": "nope", "rid": "r7", "x": [[[]]]})) == "r7"
    assert rid_of(msgspec.msgpack.encode({"rid": 5})) is None
    assert rid_of(msgspec.msgpack.encode({"rid": "x" * 257})) is None
    assert rid_of(b"\x91" * 1000 + b"\x00") is None
    assert rid_of(b"\x82\xa1x" + b"\x91" * 100_000 + b"\x00\xa3rid\xa1r") is None  # too deep
    assert rid_of(b"\xc1") is None
