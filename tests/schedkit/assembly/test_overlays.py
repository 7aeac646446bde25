"""Overlays: nested mappings merge key by key, ``!replace`` replaces, and every value keeps
the file and line that set it (``schedkit config --explain``)."""

from pathlib import Path

import pytest

from schedkit import WiringError, load_wiring
from schedkit.cli import main

ROOT = Path(__file__).resolve().parents[3]
WIRING = ROOT / "wiring.yaml"


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_nested_mapping_merges_key_by_key(write):
    overlay = write(
        "o.yaml",
        "components:\n  kv_events_publisher:\n    args:\n      kv_events_config: {profile: vllm}\n",
    )
    wiring = load_wiring(WIRING, overlay)
    spec = wiring.components["kv_events_publisher"]
    config = spec.args["kv_events_config"]
    assert config.profile == "vllm"
    assert config.replay_endpoint == "tcp://127.0.0.1:5657"  # kept from the base
    assert config.topic == "kv-events"
    assert spec.arg_locs["kv_events_config.profile"] == (str(overlay), 4)
    assert spec.arg_locs["kv_events_config.topic"] == (
        str(WIRING),
        _line(WIRING, "topic: kv-events"),
    )


def test_replace_tag_replaces_a_nested_mapping_wholesale(write):
    overlay = write(
        "o.yaml",
        "components:\n  kv_events_publisher:\n    args:\n"
        "      kv_events_config: !replace {publisher: zmq, profile: vllm,"
        " endpoint: 'tcp://127.0.0.1:0'}\n",
    )
    config = load_wiring(WIRING, overlay).components["kv_events_publisher"].args["kv_events_config"]
    assert config.profile == "vllm"
    assert config.replay_endpoint is None  # not carried over
    assert config.topic == ""


def test_replace_tag_on_an_entry_drops_the_earlier_args(write):
    overlay = write("o.yaml", "components:\n  policy: !replace {type: fcfs}\n")
    spec = load_wiring(WIRING, overlay).components["policy"]
    assert spec.type == "fcfs" and spec.args == {}


def test_changing_the_type_keeps_earlier_args_and_says_how_to_start_afresh(write):
    overlay = write("o.yaml", "components:\n  policy:\n    type: fcfs\n")
    with pytest.raises(WiringError) as info:
        load_wiring(WIRING, overlay)
    [error] = info.value.errors
    assert error.startswith(f"{overlay}:3: components.policy.args: tree_cache (given in ")
    assert "policy: !replace {type: fcfs, args: {...}}" in error


def test_a_mistyped_component_key_in_an_overlay_is_named_with_a_suggestion(write):
    overlay = write("o.yaml", "components:\n  schedular:\n    args: {max_running_requests: 3}\n")
    with pytest.raises(WiringError) as info:
        load_wiring(WIRING, overlay)
    assert info.value.errors == [
        f"{overlay}:2: components.schedular: no component 'schedular' in the wiring to adjust,"
        " and no 'type' to create one; did you mean scheduler?"
    ]


def test_explain_names_the_file_and_line_of_every_value(write, capsys):
    overlay = write(
        "o.yaml",
        "components:\n  scheduler:\n    args:\n"
        "      max_running_requests: 64\n  kv_events_publisher:\n    args:\n"
        "      kv_events_config: {profile: vllm}\n",
    )
    assert main(["config", "--explain", str(WIRING), "-o", str(overlay)]) == 0
    out = capsys.readouterr().out
    assert f"max_running_requests: 64  # {overlay}:4" in out
    assert f"profile: vllm  # {overlay}:7" in out
    assert f"topic: kv-events  # {WIRING}:{_line(WIRING, 'topic: kv-events')}" in out
    assert "hwm: 100000  # default" in out
    line = _line(WIRING, "max_prefill_tokens: 16384")
    assert f"max_prefill_tokens: 16384  # {WIRING}:{line}" in out


def test_config_writes_interpolated_values(capsys, monkeypatch):
    monkeypatch.setenv("SCHEDKIT_KV_EVENTS_ENDPOINT", "tcp://127.0.0.1:6001")
    assert main(["config", str(WIRING)]) == 0  # an EnvStr inside a converted mapping
    assert "endpoint: tcp://127.0.0.1:6001" in capsys.readouterr().out
