"""A test double chosen from a wiring overlay, and swapped into a running scheduler."""

from pathlib import Path

from my_tests.doubles import ScriptedModelRunner

from schedkit.core.schedule_batch import FinishLength, FinishMatchedToken, Req, SamplingParams

HERE = Path(__file__).resolve().parents[1]
WIRING = HERE.parents[1] / "wiring.yaml"
CAPTURE = HERE / "capture_kv_events.yaml"
SCRIPTED = HERE / "scripted.yaml"


def _req(rid, prompt, max_new_tokens=32):
    return Req(
        rid=rid,
        origin_input_ids=prompt,
        sampling_params=SamplingParams(max_new_tokens=max_new_tokens),
    )


def test_the_overlay_puts_the_scripted_runner_in_the_wiring(make_assembly):
    assembly = make_assembly(WIRING, overlays=[SCRIPTED, CAPTURE])
    runner, scheduler = assembly["model_runner"], assembly["scheduler"]
    assert isinstance(runner, ScriptedModelRunner) and scheduler.model_runner is runner
    for item in (_req("r1", [11, 12, 13]), _req("r2", [14, 15]), _req("r3", [16], 2)):
        assembly["request_receiver"].put(item)
    scheduler.run_until_idle()
    sender = assembly["output_sender"]
    assert sender.outputs == {"r1": [5, 6, 7, 2], "r2": [9, 2], "r3": [0, 0]}
    assert sender.finished == {
        "r1": FinishMatchedToken(2),  # eos_token_id 2 reached the batch result processor
        "r2": FinishMatchedToken(2),
        "r3": FinishLength(2),  # no script: fill tokens until max_new_tokens
    }


def test_swap_the_model_runner_in_a_running_scheduler(make_assembly):
    assembly = make_assembly(WIRING, overlays=[CAPTURE])
    receiver, sender = assembly["request_receiver"], assembly["output_sender"]
    simulated, original = assembly["model_runner"], assembly["scheduler"]

    receiver.put(_req("before", [1, 2, 3], 3))
    original.run_until_idle()
    assert sender.outputs["before"] == [simulated.token("before", i) for i in range(3)]

    scripted = ScriptedModelRunner(script={"during": [5, 6, 2]}, eos_token_id=2)
    with assembly.override(model_runner=scripted):
        scheduler = assembly["scheduler"]  # rebuilt for the block: it takes the runner eagerly
        assert scheduler is not original and scheduler.model_runner is scripted
        receiver.put(_req("during", [1, 2, 3]))
        scheduler.run_until_idle()
    assert sender.outputs["during"] == [5, 6, 2]
    assert sender.finished["during"] == FinishMatchedToken(2)
    assert scripted.batches == [
        ("EXTEND", ["during"]),
        ("DECODE", ["during"]),
        ("DECODE", ["during"]),
    ]

    assert assembly["scheduler"] is original  # the block's end restores the real runner
    receiver.put(_req("after", [1, 2, 3], 3))
    original.run_until_idle()
    assert sender.outputs["after"] == [simulated.token("after", i) for i in range(3)]
    assert len(scripted.batches) == 3
