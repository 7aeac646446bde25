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
    "kv_events_endpoint": (
        "  kv_events_publisher:\n    args:\n      kv_events_config:\n"
        "        endpoint: tcp://0.0.0.0:5557\n",
        5,
        "components.kv_events_publisher.args.kv_events_config.endpoint: "
        "kv_events_config.endpoint: refusing to bind 'tcp://0.0.0.0:5557': not a loopback address",
    ),
    "kv_events_replay_endpoint": (
        "  kv_events_publisher:\n    args:\n      kv_events_config:\n"
        "        replay_endpoint: http://127.0.0.1:5657\n",
        5,
        "components.kv_events_publisher.args.kv_events_config.replay_endpoint: "
        "kv_events_config.replay_endpoint: unsupported KV-events endpoint 'http://127.0.0.1:5657'",
    ),
    "kv_events_publisher_name": (
        "  kv_events_publisher:\n    args:\n      kv_events_config:\n        publisher: zmqq\n",
        5,
        "components.kv_events_publisher.args.kv_events_config.publisher: "
        "kv_events_config.publisher: unknown KV-event publisher 'zmqq'; valid: ",
    ),
    "kv_events_json_string": (
        "  kv_events_publisher:\n    args:\n      kv_events_config: '{\"endpoint\": '\n",
        4,
        "components.kv_events_publisher.args.kv_events_config: KV-events config is not valid JSON",
    ),
    "metrics_endpoint": (
        "  kv_events_publisher:\n    args:\n      metrics_endpoint: localhost:5558\n",
        4,
        "components.kv_events_publisher.args.metrics_endpoint: metrics_endpoint 'localhost:5558' "
        "is not a ZeroMQ endpoint",
    ),
    "zmq_server_remote": (
        "  request_receiver:\n    type: zmq_server\n    args:\n"
        "      endpoint: tcp://0.0.0.0:30010\n",
        5,
        "components.request_receiver.args.endpoint: refusing to bind 'tcp://0.0.0.0:30010'",
    ),
    "zmq_server_inproc": (
        "  request_receiver:\n    type: zmq_server\n    args:\n      endpoint: inproc://edge\n",
        5,
        "components.request_receiver.args.endpoint: zmq_server listens on tcp://HOST:PORT or "
        "ipc://PATH, got 'inproc://edge'",
    ),
    "zmq_output_sender": (
        "  output_sender: !replace\n    type: zmq_output_sender\n    args:\n"
        "      endpoint: tcp://10.0.0.1:5560\n      mode: bind\n",
        5,
        "components.output_sender.args.endpoint: refusing to bind 'tcp://10.0.0.1:5560'",
    ),
    "parallel_state": (
        "  parallel_state:\n    args:\n      tp_size: 2\n      tp_rank: 2\n",
        5,
        "components.parallel_state.args.tp_rank: tp_rank must be in [0, tp_size), got 2/2",
    ),
    "lpm": (
        "  policy:\n    args:\n      in_batch_deprioritize_threshold: 0\n",
        4,
        "components.policy.args.in_batch_deprioritize_threshold: in_batch_deprioritize_threshold"
        " must be an integer >= 1 (tokens), got 0",
    ),
    "shortest_prefill_first": (
        "  tree_cache:\n    args:\n      disable: true\n"
        "  policy: !replace\n    type: shortest-prefill-first\n"
        "    args: {tree_cache: !ref tree_cache}\n",
        7,
        "components.policy.args.tree_cache: shortest-prefill-first requires prefix caching",
    ),
    "hiradix_cache": (
        "  tree_cache:\n    type: hiradix_cache\n    args:\n      hicache_size: 4096\n",
        5,
        "components.tree_cache.args.hicache_size: the host pool (4096 tokens from "
        "hicache_size=4096, hicache_ratio=2.0) must be at least the device pool (65536 tokens)",
    ),
    "http_server_remote": (
        "  http_server:\n    type: http_server\n    args:\n      address: 0.0.0.0:30000\n"
        "      scheduler_endpoint: ipc:///tmp/schedkit-edge\n",
        5,
        "components.http_server.args.address: refusing to listen on '0.0.0.0:30000': not a "
        "loopback address",
    ),
    "http_server_limits": (
        "  http_server:\n    type: http_server\n    args:\n"
        "      scheduler_endpoint: ipc:///tmp/schedkit-edge\n      limits: {max_body_byte: 1}\n",
        6,
        "components.http_server.args.limits: limits: Object contains unknown field "
        "`max_body_byte`; valid keys: ",
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
    import socket
    import threading

    import zmq

    def no_sockets(*args, **kwargs):
        raise AssertionError("validate made a socket, a ZeroMQ context or a thread")

    for owner, name in ((zmq, "Context"), (socket, "socket"), (threading.Thread, "start")):
        monkeypatch.setattr(owner, name, no_sockets)
    # Every argument check of the shipped wiring and the serve edge runs on these values.
    wiring = read_wiring(WIRING, ROOT / "examples" / "serve.yaml")
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


def test_a_build_error_inside_a_mapping_argument_names_the_line_of_its_key(write):
    from schedkit.kv_events.config import KvEventsConfig

    overlay = write(
        "o.yaml",
        "components:\n  kv_events_publisher:\n    args:\n      kv_events_config:\n"
        "        topic: t\n        endpoint: tcp://127.0.0.1:0\n",
    )
    wiring = load_wiring(WIRING, overlay)
    # A value that validation never saw: the publisher's own check reports it at build.
    spec = wiring.components["kv_events_publisher"]
    spec.args["kv_events_config"] = KvEventsConfig(endpoint="tcp://0.0.0.0:0")
    with pytest.raises(WiringError) as info:
        build(wiring)
    assert str(info.value).startswith(
        f"{overlay}:6: components.kv_events_publisher.args.kv_events_config.endpoint: "
    )


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


# Constructors that still raise on their own, and why validate cannot run that check.
BUILD_ONLY = {
    "zmq_server": "the open-files limit left for connections belongs to the machine",
    "zmq_output_sender": "a bind or connect that fails (a port in use) belongs to the machine",
    "kv_events_publisher": "tree_cache.take_events: validate checks the field's protocol",
}


def test_every_constructor_check_is_one_validate_runs():
    import inspect

    from schedkit.components import COMPONENT_MODULES
    from schedkit.core.component import lookup

    raising = set()
    for name in COMPONENT_MODULES:
        init = lookup(name).__dict__.get("__attrs_post_init__")
        if init is not None and "raise " in inspect.getsource(init):
            raising.add(name)
    assert raising == set(BUILD_ONLY)
