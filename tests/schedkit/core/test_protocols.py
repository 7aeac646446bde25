"""Each swappable component type has a protocol under its wiring key; validate checks a
swapped-in class against it, and a swap leaves the run's figures true."""

from pathlib import Path

import pytest

from schedkit import WiringError, build, load_wiring
from schedkit.assembly.validate import protocol_members
from schedkit.assembly.yaml_reader import Replace, read_wiring
from schedkit.core.protocols import COMPONENT_PROTOCOLS
from schedkit.sim.driver import drive
from schedkit.workloads.workload import synthetic

ROOT = Path(__file__).resolve().parents[3]
WIRING = ROOT / "wiring.yaml"
COUNTING = {
    "plugins": ["tests.schedkit.sample_components"],
    "components": {"metrics_reporter": Replace({"type": "sample_counting_reporter"})},
}


def test_every_component_of_the_default_wiring_but_parallel_state_has_a_protocol():
    keys = set(read_wiring(WIRING).components)
    assert keys - set(COMPONENT_PROTOCOLS) == {"parallel_state"}


@pytest.mark.parametrize("key", sorted(COMPONENT_PROTOCOLS))
def test_each_protocol_says_its_wiring_key_and_every_member(key):
    protocol = COMPONENT_PROTOCOLS[key]
    doc = protocol.__doc__
    assert "Wiring key ``" in doc  # the key, or for an edge the key path, e.g. a.sender
    assert protocol_members(protocol)


@pytest.mark.parametrize(
    ("reporter", "problem"),
    [
        (
            "sample_half_reporter",
            "HalfReporter does not implement MetricsReporterComponent, the interface the rest of "
            "the assembly uses under the key 'metrics_reporter': it lacks "
            "advance_forward_ct_decode, increment_generated_tokens, maybe_log_idle_metrics, "
            "observe_finished_request, on_pause, report_decode_stats, stats",
        ),
        (
            "sample_wrong_arity_reporter",
            "WrongArityReporter does not implement MetricsReporterComponent, the interface the "
            "rest of the assembly uses under the key 'metrics_reporter': its "
            "increment_generated_tokens(n, step) requires 'step', which callers do not pass (the "
            "protocol: increment_generated_tokens(n)); its report_decode_stats() takes 0 "
            "positional argument(s); callers pass up to 1 ('batch' has no place) (the protocol: "
            "report_decode_stats(batch))",
        ),
    ],
    ids=["lacking members", "wrong signature"],
)
def test_a_swapped_in_class_that_does_not_conform_is_named_at_its_type_line(
    write, reporter, problem
):
    overlay = write(
        "o.yaml",
        "plugins: [tests.schedkit.sample_components]\ncomponents:\n"
        f"  metrics_reporter: !replace\n    type: {reporter}\n",
    )
    with pytest.raises(WiringError) as info:
        load_wiring(WIRING, overlay)
    [error] = info.value.errors
    assert error == (
        f"{overlay}:4: components.metrics_reporter.type: {problem} (see docs/components.md)"
    )


def test_a_late_call_bound_to_a_method_of_another_arity_is_named_at_its_line(write):
    overlay = write(
        "o.yaml",
        "components:\n  batch_result_processor:\n    args:\n"
        "      report_decode_stats: !call metrics_reporter.on_pause\n",
    )
    with pytest.raises(WiringError) as info:
        load_wiring(WIRING, overlay)
    [error] = info.value.errors
    assert error == (
        f"{overlay}:4: components.batch_result_processor.args.report_decode_stats: "
        "!call metrics_reporter.on_pause: the field calls it with 1 positional argument(s), "
        "which MetricsReporter.on_pause() cannot take; bind a method of that arity"
    )


def _figures(*overlays) -> dict:
    with build(load_wiring(WIRING, *overlays)) as assembly:
        workload = synthetic("chat", 120, 16.0, 0)
        figures = drive(assembly, workload).to_dict()
        reporter = assembly["metrics_reporter"]
    for wall in ("wall_s", "request_throughput_per_wall_s", "output_throughput_tokens_per_wall_s"):
        figures.pop(wall)
    figures.pop("peak_rss_mib")
    return figures, reporter


def test_the_summary_is_the_same_with_a_reporter_that_keeps_no_figures():
    events_off = {"components": {"kv_events_publisher": {"args": {"kv_events_config": None}}}}
    real, _ = _figures(events_off)
    swapped, reporter = _figures(events_off, COUNTING)
    assert reporter.counts["report_prefill_stats"] > 0
    assert real["prefix_cache_hit_rate"] > 0.3
    assert swapped == real
