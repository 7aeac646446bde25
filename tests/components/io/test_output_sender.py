import pytest
import zmq

from schedkit.components.io.io_struct import (
    BatchEmbeddingOutput,
    BatchTokenIDOutput,
    decode_output,
    encode,
)
from schedkit.components.io.output_sender import InprocOutputCollector, OutputTally, ZmqOutputSender
from schedkit.components.io.token_wire import EncodedTokenIDOutput
from schedkit.core.component import component_name
from schedkit.core.schedule_batch import FinishLength, FinishMatchedToken


def token_msg(*entries):
    """A BatchTokenIDOutput from (rid, new_tokens, finish_reason) entries."""
    return BatchTokenIDOutput(
        rids=[rid for rid, _, _ in entries],
        finished_reasons=[reason for _, _, reason in entries],
        output_ids=[tokens for _, tokens, _ in entries],
        prompt_tokens=[4] * len(entries),
        completion_tokens=[len(tokens) for _, tokens, _ in entries],
        cached_tokens=[0] * len(entries),
        cached_tokens_details=[None] * len(entries),
    )


def encoded(msg):
    """``msg`` as the output streamer hands a decode step's message to a sender taking it
    encoded."""
    finished = [rid for rid, r in zip(msg.rids, msg.finished_reasons, strict=True) if r]
    return EncodedTokenIDOutput(encode(msg), msg.rids, finished, sum(map(len, msg.output_ids)))


def tally_counts(tally):
    """What an ``OutputTally`` counted."""
    return (
        tally.messages,
        tally.output_tokens,
        tally.finished,
        tally.bytes_encoded,
        tally.double_finishes,
    )


def test_registered_names():
    assert component_name(InprocOutputCollector) == "inproc_output_collector"
    assert component_name(ZmqOutputSender) == "zmq_output_sender"


def test_tally_counts_and_keeps_no_messages():
    tally = OutputTally()
    first = token_msg(("a", [1, 2], None), ("b", [7], None))
    second = token_msg(("a", [3], FinishLength(3)), ("b", [8, 9], FinishMatchedToken(9)))
    tally.send(first)
    tally.send(second)
    tally.send(token_msg(("a", [4], None)))  # after its final send: an error
    assert (tally.messages, tally.output_tokens, tally.finished) == (3, 7, 2)
    assert tally.double_finishes == ["a"]
    assert tally.bytes_encoded > len(encode(first))
    # The same messages handed over encoded are counted alike.
    again = OutputTally()
    assert again.takes_encoded and not OutputTally(encode=False).takes_encoded
    again.send(encoded(first))
    again.send(encoded(second))
    again.send(encoded(token_msg(("a", [4], None))))
    assert tally_counts(again) == tally_counts(tally)
    # One rids column sent again after one of its rids finished: flagged, not taken as clear.
    column = ["c", "d"]
    for reasons in ([None, None], [None, FinishLength(2)], [None, None]):
        msg = token_msg(("c", [1], reasons[0]), ("d", [1], reasons[1]))
        again.send(EncodedTokenIDOutput(encode(msg), column, ["d"] if reasons[1] else [], 2))
    assert again.double_finishes == ["a", "d"]


def test_tally_without_encoding_counts_no_bytes():
    tally = OutputTally(encode=False)
    tally.send(token_msg(("a", [1], FinishLength(1))))
    assert (tally.bytes_encoded, tally.finished) == (0, 1)
    tally.close()
    with pytest.raises(RuntimeError, match="closed"):
        tally.send(token_msg(("b", [1], None)))


def test_collector_concatenates_tokens_and_records_finishes():
    collector = InprocOutputCollector()
    collector.send(token_msg(("a", [1, 2], None), ("b", [7], None)))
    collector.send(token_msg(("a", [3], FinishLength(3))))
    collector.send(token_msg(("b", [8, 9], FinishMatchedToken(9))))
    assert collector.outputs == {"a": [1, 2, 3], "b": [7, 8, 9]}
    assert collector.finished == {"a": FinishLength(3), "b": FinishMatchedToken(9)}
    assert collector.send_counts == {"a": 1, "b": 1}
    assert collector.double_finishes == []
    assert len(collector.messages) == 3


def test_collector_keeps_what_went_through_the_encoding():
    collector = InprocOutputCollector()
    sent = token_msg(("a", [1], FinishLength(1)))
    collector.send(sent)
    received = collector.messages[0]
    assert received == sent
    assert received is not sent
    assert isinstance(received.finished_reasons[0], FinishLength)


def test_collector_without_roundtrip_keeps_the_object():
    collector = InprocOutputCollector(roundtrip=False)
    sent = token_msg(("a", [1], None))
    collector.send(sent)
    assert collector.messages[0] is sent
    assert not collector.takes_encoded and InprocOutputCollector().takes_encoded


def test_collector_decodes_an_encoded_message():
    collector = InprocOutputCollector()
    sent = token_msg(("a", [1, 2], FinishLength(2)))
    collector.send(encoded(sent))
    assert collector.messages == [sent]
    assert (collector.outputs, collector.send_counts) == ({"a": [1, 2]}, {"a": 1})


def test_collector_flags_a_rid_sent_after_its_finish():
    collector = InprocOutputCollector()
    collector.send(token_msg(("a", [1], FinishLength(1))))
    collector.send(token_msg(("a", [], FinishLength(1))))
    collector.send(token_msg(("a", [2], None)))
    assert collector.double_finishes == ["a", "a"]
    assert collector.send_counts == {"a": 2}


def test_collector_unencodable_message_raises():
    collector = InprocOutputCollector()
    bad = token_msg(("a", [1], None))
    bad.output_ids = [[object()]]
    with pytest.raises(TypeError):
        collector.send(bad)


def test_collector_records_embedding_finishes():
    collector = InprocOutputCollector()
    collector.send(
        BatchEmbeddingOutput(
            rids=["e"], finished_reasons=[FinishLength(0)], prompt_tokens=[3], cached_tokens=[0]
        )
    )
    assert collector.finished == {"e": FinishLength(0)}
    assert collector.outputs == {}


def test_collector_refuses_sends_after_close():
    collector = InprocOutputCollector()
    collector.close()
    with pytest.raises(RuntimeError, match="closed"):
        collector.send(token_msg(("a", [1], None)))


@pytest.fixture
def pull():
    socket = zmq.Context.instance().socket(zmq.PULL)
    socket.setsockopt(zmq.RCVTIMEO, 5000)
    yield socket
    socket.close(linger=0)


def test_zmq_sender_connects_to_a_bound_detokenizer(pull):
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    sender = ZmqOutputSender(endpoint=f"tcp://127.0.0.1:{port}")
    try:
        first = token_msg(("a", [1, 2], None))
        second = token_msg(("a", [3], FinishLength(3)))
        sender.send(first)
        sender.send(encoded(second))
        assert decode_output(pull.recv()) == first
        assert pull.recv() == encode(second)
    finally:
        sender.close()
    sender.close()  # idempotent


def test_zmq_sender_binds_a_free_loopback_port(pull):
    sender = ZmqOutputSender(endpoint="tcp://127.0.0.1:0", mode="bind", linger_ms=100)
    try:
        assert sender.bound_endpoint.startswith("tcp://127.0.0.1:")
        assert not sender.bound_endpoint.endswith(":0")
        pull.connect(sender.bound_endpoint)
        msg = token_msg(("z", [5], FinishLength(1)))
        sender.send(msg)
        assert decode_output(pull.recv()) == msg
    finally:
        sender.close()


def test_zmq_sender_refuses_to_bind_a_remote_address():
    with pytest.raises(ValueError, match="loopback"):
        ZmqOutputSender(endpoint="tcp://0.0.0.0:0", mode="bind")


def test_zmq_sender_rejects_bad_settings():
    with pytest.raises(ValueError, match="mode must be"):
        ZmqOutputSender(endpoint="tcp://127.0.0.1:1", mode="listen")
    with pytest.raises(ValueError, match="linger_ms"):
        ZmqOutputSender(endpoint="tcp://127.0.0.1:1", linger_ms=-1)
    with pytest.raises(ValueError, match="unsupported endpoint"):
        ZmqOutputSender(endpoint="127.0.0.1:1")


def test_zmq_sender_reports_a_port_in_use(pull):
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    with pytest.raises(ValueError, match="cannot bind PUSH socket"):
        ZmqOutputSender(endpoint=f"tcp://127.0.0.1:{port}", mode="bind")
