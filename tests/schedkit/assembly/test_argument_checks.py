"""``validate`` runs every check that build runs (components' own cross-argument checks
included) without building, naming the file and line that set the value and the argument."""

from pathlib import Path

import pytest

from schedkit import WiringError, build, load_wiring
from schedkit.assembly.validate import validate
from schedkit.assembly.yaml_reader import read_wiring

ROOT = Path(__file__).resolve().parents[3]
WIRING = ROOT / "wiring.yaml"

CASES = {
    "swa_capacity": (
        "  tree_cache:\n    type: swa_radix_cache\n    args:\n      sliding_window_size: 256\n"
        "      swa_capacity: 8190\n",
        6,
        "components.tree_cache.args.swa_capacity: swa_capacity must be a non-negative multiple"
        " of page_size=16, got 8190",
    ),
    "prometheus_port": (
        "  metrics_reporter:\n    args:\n      prometheus_port: 9400\n",
        4,
        "components.metrics_reporter.args.prometheus_port: prometheus_port is set but "
        "enable_metrics is false",
    ),
    "eos_token_id": (
        "  model_runner:\n    args:\n      eos_token_id: 40000\n",
        4,
        "components.model_runner.args.eos_token_id: eos_token_id must be in "
        "[0, vocab_size=32000), got 40000",
    ),
    "chunked_prefill_size": (
        "  scheduler:\n    args:\n      chunked_prefill_size: 8\n",
        4,
        "components.scheduler.args.chunked_prefill_size: chunked_prefill_size must be None",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_reports_what_build_would_at_the_overlay_line(write, case):
    text, line, message = CASES[case]
    overlay = write("o.yaml", "components:\n" + text)
    with pytest.raises(WiringError) as info:
        load_wiring(WIRING, overlay)
    [error] = info.value.errors
    assert error.startswith(f"{overlay}:{line}: {message}")


def test_nothing_is_built_by_validate(write, monkeypatch):
    import zmq

    def no_sockets(*args, **kwargs):
        raise AssertionError("validate made a ZeroMQ context")

    monkeypatch.setattr(zmq, "Context", no_sockets)
    wiring = read_wiring(WIRING)
    assert validate(wiring) == []


def test_a_value_set_in_the_base_is_reported_at_the_base_line(write):
    base = write("w.yaml", WIRING.read_text().replace("size: 65536", "size: 65530"))
    with pytest.raises(WiringError) as info:
        load_wiring(base)
    [error] = info.value.errors
    assert error.startswith(f"{base}:13: components.allocator.args.size: size must be a ")


def test_a_bad_value_is_reported_once(write):
    overlay = write(
        "o.yaml", 'components:\n  scheduler:\n    args:\n      max_running_requests: "lots"\n'
    )
    with pytest.raises(WiringError) as info:
        load_wiring(WIRING, overlay)
    assert len(info.value.errors) == 1
    assert "max_running_requests: invalid value 'lots'" in info.value.errors[0]


def test_a_build_error_names_the_argument_and_the_line_that_set_it(write):
    wiring = load_wiring(
        WIRING,
        write("o.yaml", "components:\n  model_runner:\n    args:\n      eos_probability: 0.0\n"),
    )
    # A value that validation never saw: the constructor's own check reports it.
    wiring.components["model_runner"].args["eos_probability"] = 0.5
    with pytest.raises(WiringError) as info:
        build(wiring)
    message = str(info.value)
    assert ":4: components.model_runner.args.eos_probability: " in message


def test_a_plugin_that_cannot_be_imported_gives_a_path_hint_and_no_guess(write):
    overlay = write(
        "o.yaml",
        "plugins: [my_missing_plugin]\ncomponents:\n"
        "  metrics_reporter: !replace {type: counting_reporter}\n",
    )
    with pytest.raises(WiringError) as info:
        load_wiring(WIRING, overlay)
    errors = info.value.errors
    assert errors[0] == (
        f"{overlay}:1: plugins: cannot import 'my_missing_plugin': no module named "
        "'my_missing_plugin' on the Python path; run from the directory that holds it, add "
        "that directory to PYTHONPATH (PYTHONPATH=. schedkit ...), or install your package "
        "(pip install -e .)"
    )
    assert "did you mean" not in "\n".join(errors)
    assert "perhaps registered by the plugin my_missing_plugin" in errors[1]


def test_a_plugin_that_raises_names_its_failing_line(write, tmp_path, monkeypatch):
    (tmp_path / "broken_plugin.py").write_text("x = 1\nraise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    overlay = write("o.yaml", "plugins: [broken_plugin]\n")
    with pytest.raises(WiringError) as info:
        load_wiring(WIRING, overlay)
    assert info.value.errors[0].endswith(
        f"cannot import 'broken_plugin': RuntimeError: boom (at {tmp_path}/broken_plugin.py:2)"
    )
