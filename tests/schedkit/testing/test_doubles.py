from pathlib import Path

import pytest

from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.io.io_struct import BatchTokenIDOutput
from schedkit.components.io.kv_events_publisher import KvEventsPublisher
from schedkit.core.schedule_batch import FinishLength, Req, SamplingParams
from schedkit.kv_events import BlockStored, KVEventBatch, create_publisher
from schedkit.testing import (
    CapturingEventPublisher,
    FakeClock,
    RecordingOutputSender,
    capture_logs,
)

WIRING = Path(__file__).resolve().parents[3] / "wiring.yaml"
CAPTURE = {
    "components": {"kv_events_publisher": {"args": {"kv_events_config": {"publisher": "capture"}}}}
}


def test_fake_clock_moves_only_forward_when_told():
    clock = FakeClock(start=5.0)
    now = clock.now
    assert now() == 5.0
    assert clock.advance(0.25) == 5.25 and now() == 5.25
    with pytest.raises(ValueError, match=r"only moves forward; got advance\(-1\)"):
        clock.advance(-1)


def _output(rids, tokens, reasons):
    return BatchTokenIDOutput(
        rids=rids,
        finished_reasons=reasons,
        output_ids=tokens,
        prompt_tokens=[1] * len(rids),
        completion_tokens=[len(t) for t in tokens],
        cached_tokens=[0] * len(rids),
        cached_tokens_details=[None] * len(rids),
    )


def test_recording_sender_keeps_decoded_messages_per_request():
    sender = RecordingOutputSender()
    sent = _output(["a", "b"], [[1, 2], [3]], [None, FinishLength(1)])
    sender.send(sent)
    sender.send(_output(["a"], [[4]], [FinishLength(3)]))
    assert sender.messages[0] == sent and sender.messages[0] is not sent  # a round trip
    assert sender.outputs == {"a": [1, 2, 4], "b": [3]}
    assert sender.finished == {"a": FinishLength(3), "b": FinishLength(1)}
    sender.close()
    with pytest.raises(RuntimeError, match="closed"):
        sender.send(sent)


@pytest.mark.parametrize("profile", ["sglang", "vllm"])
def test_capturing_publisher_round_trips_batches_under_the_profile(profile):
    publisher = create_publisher({"publisher": "capture", "profile": profile}, dp_rank=3)
    assert CapturingEventPublisher.instances == [publisher]
    event = BlockStored([11, 12], None, [1, 2, 3, 4], 2, None)
    assert publisher.publish(KVEventBatch(1.5, [event])) is True
    (batch,) = publisher.batches
    assert (batch.ts, batch.attn_dp_rank, batch.events) == (1.5, 3, [event])
    assert publisher.events == [event] and publisher.published == 1
    publisher.shutdown()
    assert publisher.publish(KVEventBatch(2.0, [event])) is False and publisher.dropped == 1


def test_a_wiring_selects_the_capturing_publisher_and_the_recording_sender(make_assembly):
    overlay = {
        "components": {
            **CAPTURE["components"],
            "output_sender": {"type": "recording_output_sender"},
        }
    }
    assembly = make_assembly(WIRING, overlays=[overlay])
    scheduler, sender = assembly["scheduler"], assembly["output_sender"]
    assert isinstance(sender, RecordingOutputSender)
    prompt = list(range(100, 140))  # two and a half pages of 16
    scheduler.submit(
        Req(rid="r", origin_input_ids=prompt, sampling_params=SamplingParams(max_new_tokens=3))
    )
    scheduler.run_until_idle()
    assert len(sender.outputs["r"]) == 3 and sender.finished["r"] == FinishLength(3)
    (publisher,) = CapturingEventPublisher.instances
    assert assembly["kv_events_publisher"].published == publisher.published > 0
    stored = [e for e in publisher.events if isinstance(e, BlockStored)]
    assert [t for e in stored for t in e.token_ids][:32] == prompt[:32]


def test_capture_logs_sees_component_warnings():
    cache = RadixCache(page_size=1, capacity=8, enable_kv_cache_events=True)
    with capture_logs() as logs:
        KvEventsPublisher(
            tree_cache=cache, max_running_requests=1, max_total_num_tokens=8, get_stats=dict
        )
    assert [entry["event"] for entry in logs] == ["kv_events.cache_records_unpublished_events"]
    assert logs[0]["log_level"] == "warning"
