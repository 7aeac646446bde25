"""The default scheduler with its output streamer replaced by a fake: what does the batch
result processor ask it to stream?"""

from pathlib import Path

from schedkit.components.io.output_streamer import OutputStreamer
from schedkit.core.schedule_batch import Req, SamplingParams
from schedkit.testing import fake

HERE = Path(__file__).resolve().parents[1]
WIRING = HERE.parents[1] / "wiring.yaml"
CAPTURE = HERE / "capture_kv_events.yaml"
SMALL_CHUNKS = {"components": {"scheduler": {"args": {"chunked_prefill_size": 64}}}}


def test_each_batch_is_streamed_once_and_a_chunked_request_is_skipped(make_assembly):
    streamer = fake(OutputStreamer)
    streamed = []

    # Arguments are recorded by reference and the scheduler reuses its lists: note what each
    # call saw at the time it was made.
    def note(reqs, return_logprob=False, skip_req=None, is_idle_batch=False):
        streamed.append(
            (
                [req.rid for req in reqs],
                skip_req.rid if skip_req is not None else None,
                [req.rid for req in reqs if req.finished_reason is not None],
            )
        )

    streamer.side_effects["stream_output"] = note
    assembly = make_assembly(
        WIRING, overlays=[CAPTURE, SMALL_CHUNKS], overrides={"output_streamer": streamer}
    )
    scheduler = assembly["scheduler"]
    assert assembly["batch_result_processor"].output_streamer is streamer

    long_prompt, short_prompt = list(range(1000, 1150)), list(range(2000, 2020))
    scheduler.submit(
        Req(
            rid="long",
            origin_input_ids=long_prompt,
            sampling_params=SamplingParams(max_new_tokens=3),
        )
    )
    scheduler.submit(
        Req(
            rid="short",
            origin_input_ids=short_prompt,
            sampling_params=SamplingParams(max_new_tokens=2),
        )
    )
    assert scheduler.run_until_idle() == 5

    assert streamed == [
        # 150 prompt tokens in chunks of 64: the two middle chunks produce no token, and the
        # chunked request is passed as skip_req
        (["long"], "long", []),
        (["long"], "long", []),
        # the last 22 tokens and all of "short" fit the next 64-token chunk
        (["long", "short"], None, []),
        # decode steps: "short" ends after 2 tokens, "long" after 3
        (["long", "short"], None, ["short"]),
        (["long"], None, ["long"]),
    ]
    calls = streamer.calls_to("stream_output")
    assert [call.arguments["return_logprob"] for call in calls] == [False] * 5
    assert streamer.calls == calls  # the processor used nothing else of the streamer
