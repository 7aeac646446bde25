"""``schedkit serve --http``'s prefill step bound: from the runner's cost model (two idle decode
steps), set in milliseconds or off, refused when malformed, left out where there is no cost
model; the overlays validate and build a scheduler that carries it."""

from __future__ import annotations

import argparse

import pytest

import schedkit
from schedkit import wirings
from schedkit.cli import _parser
from schedkit.cli.http_args import http_overlays
from schedkit.cli.http_step_bound import parse_prefill_step, prefill_step_overlay
from schedkit.runner import presets


def _scheduler_args(overlay: dict | None) -> dict:
    assert overlay is not None
    return overlay["components"]["scheduler"]["args"]


def test_auto_is_two_idle_decode_steps_of_the_wirings_cost_model():
    wiring = schedkit.load_wiring(wirings.path())
    overlay, line = prefill_step_overlay("auto", wiring, 32768)
    args = _scheduler_args(overlay)
    assert args["max_prefill_step_seconds"] == pytest.approx(2 * (6.137e-3 + 1.413e-5))
    assert args["prefill_seconds"].target == "model_runner"
    assert "448 fresh tokens at the start of a prompt, 192 at 32,768 tokens deep" in line
    # A preset's coefficients (and overheads) give its own bound.
    preset, _ = presets.preset_overlay(wiring, "llama3-70b", None, None)
    big = _scheduler_args(
        prefill_step_overlay("auto", schedkit.load_wiring(wirings.path(), preset), 32768)[0]
    )
    idle_decode = 13.48e-3 + 126e-6 + 34.65e-6 + 4.4e-6  # fixed, step, per-seq, per-request
    assert big["max_prefill_step_seconds"] == pytest.approx(2 * idle_decode)


def test_milliseconds_off_and_wirings_without_a_cost_model():
    wiring = schedkit.load_wiring(wirings.path())
    assert _scheduler_args(prefill_step_overlay(0.005, wiring, 4096)[0]) == {
        "max_prefill_step_seconds": 0.005,
        "prefill_seconds": _scheduler_args(prefill_step_overlay("auto", wiring, 4096)[0])[
            "prefill_seconds"
        ],
    }
    assert prefill_step_overlay("off", wiring, 4096)[0] is None
    free = schedkit.load_wiring(
        wirings.path(), {"components": {"model_runner": {"args": {"zero_cost": True}}}}
    )
    assert prefill_step_overlay("auto", free, 4096) == (
        None,
        "prefill steps bounded by the wiring's tokens only (the steps are free)",
    )
    assert parse_prefill_step("12.5") == pytest.approx(0.0125)
    for bad in ("0", "-1", "nan", "inf", "fast"):
        with pytest.raises(argparse.ArgumentTypeError, match="auto, off or milliseconds"):
            parse_prefill_step(bad)


def test_serve_http_overlays_bound_the_scheduler_and_name_its_key_shares(tmp_path, capsys):
    base = [str(wirings.path())]
    args = _parser("serve").parse_args(["serve", *base, "--http", "127.0.0.1:0"])
    overlays = http_overlays(args, tmp_path, lambda: schedkit.load_wiring(wirings.path()))
    assert "prefill steps of at most 12.3 ms" in capsys.readouterr().err
    wiring = schedkit.load_wiring(wirings.path(), *overlays)
    scheduler = wiring.components["scheduler"].args
    assert scheduler["max_prefill_step_seconds"] == pytest.approx(0.0123, abs=1e-4)
    assert wiring.components["http_server"].args["scheduler_shares_keys"] is True
    # The internal edge releases all the front end forwards (it keeps its own bounds).
    assert wiring.components["request_receiver"].args["release_tokens_per_client"] == 1 << 20
    off = _parser("serve").parse_args(
        [
            *("serve", *base, "--http", "127.0.0.1:0", "--http-prefill-step", "off"),
            *("--http-limit", "max_forwarded_tokens=4096"),
        ]
    )
    overlays = http_overlays(off, tmp_path, lambda: schedkit.load_wiring(wirings.path()))
    wiring = schedkit.load_wiring(wirings.path(), *overlays)
    assert "max_prefill_step_seconds" not in wiring.components["scheduler"].args
    assert wiring.components["request_receiver"].args["release_tokens_per_client"] == 4096
    with pytest.raises(SystemExit):
        _parser("serve").parse_args(["serve", *base, "--http-prefill-step", "0"])
