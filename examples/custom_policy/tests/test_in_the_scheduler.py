"""The policy in the default scheduler, chosen by the policy.yaml overlay."""

from pathlib import Path

import pytest
from my_policies import ShortestUncachedFirst

from schedkit.core.schedule_batch import Req, SamplingParams

HERE = Path(__file__).resolve().parents[1]
WIRING = HERE.parents[1] / "wiring.yaml"
CAPTURE = {
    "plugins": ["schedkit.testing.doubles"],
    "components": {
        "kv_events_publisher": {"args": {"kv_events_config": {"publisher": "capture"}}},
        "output_sender": {"type": "recording_output_sender"},
    },
}
ONE_AT_A_TIME = {"components": {"scheduler": {"args": {"max_running_requests": 1}}}}


@pytest.mark.parametrize(
    ("overlays", "finish_order"),
    [
        ([], ["long", "short", "mid"]),  # lpm: no cached prefixes, so arrival order
        ([HERE / "policy.yaml"], ["short", "mid", "long"]),
    ],
)
def test_admission_order_follows_the_policy(make_assembly, overlays, finish_order):
    assembly = make_assembly(WIRING, overlays=[CAPTURE, ONE_AT_A_TIME, *overlays])
    if overlays:
        assert isinstance(assembly["policy"], ShortestUncachedFirst)
    scheduler = assembly["scheduler"]
    for rid, first, prompt_len in [("long", 1000, 300), ("short", 2000, 20), ("mid", 3000, 100)]:
        prompt = list(range(first, first + prompt_len))  # no two prompts share a prefix
        params = SamplingParams(max_new_tokens=4)
        scheduler.submit(Req(rid=rid, origin_input_ids=prompt, sampling_params=params))
    scheduler.run_until_idle()
    assert list(assembly["output_sender"].finished) == finish_order
