"""A model sped up by a factor: every time term divided by it, and one step of the runner
takes that much less time."""

from pathlib import Path

import attrs
import pytest

from schedkit.assembly.loading import load_wiring
from schedkit.runner.model_runner import SimulatedModelRunner
from schedkit.runner.presets import preset_overlay
from schedkit.runner.time_scale import TIME_TERMS, faster_model

WIRING = Path(__file__).resolve().parents[3] / "wiring.yaml"


def test_every_time_term_is_divided_and_the_rest_and_the_original_are_kept():
    h100 = preset_overlay(load_wiring(WIRING), "llama3-8b", "h100")[0]
    fast = faster_model(h100, 4.0)
    args, fast_args = (
        h100["components"]["model_runner"]["args"],
        fast["components"]["model_runner"]["args"],
    )
    assert set(TIME_TERMS) <= set(args)
    for term in TIME_TERMS:
        assert fast_args[term] == pytest.approx(args[term] / 4)
    assert fast_args["vocab_size"] == args["vocab_size"]
    assert fast["components"]["allocator"] == h100["components"]["allocator"]
    assert h100["components"]["model_runner"]["args"] is args  # untouched
    # The runner's own time terms are the ones scaled: none left out.
    floats = {
        f.name
        for f in attrs.fields(SimulatedModelRunner)
        if f.init and f.type in (float, "float") and f.name != "eos_probability"
    }
    assert floats <= set(TIME_TERMS)


@pytest.mark.parametrize("factor", [0, -1, float("inf"), float("nan")])
def test_a_factor_that_is_not_a_finite_positive_number_is_refused(factor):
    with pytest.raises(ValueError, match="a time factor must be a finite number > 0"):
        faster_model({"components": {"model_runner": {"args": {}}}}, factor)


def test_an_overlay_without_the_time_terms_is_refused_naming_them():
    with pytest.raises(ValueError, match="gives no model_runner prefill_fixed, prefill_per"):
        faster_model({"components": {"model_runner": {"args": {"vocab_size": 8}}}}, 2.0)
