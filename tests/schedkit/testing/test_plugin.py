import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

# Inner runs happen in this process; hypothesis's plugin would import hypothesis afresh in each.
QUIET = ("-p", "no:hypothesispytest")

WIRING = Path(__file__).resolve().parents[3] / "wiring.yaml"

LOOPBACK = """
import pytest

@pytest.fixture(autouse=True)
def loopback_kv_events(monkeypatch):
    monkeypatch.setenv("SCHEDKIT_KV_EVENTS_ENDPOINT", "tcp://127.0.0.1:0")
    monkeypatch.setenv("SCHEDKIT_KV_REPLAY_ENDPOINT", "tcp://127.0.0.1:0")
"""


def test_a_test_that_forgets_shutdown_fails_naming_the_components(pytester):
    pytester.makepyfile(
        LOOPBACK
        + f"""
import schedkit

def test_forgets_shutdown(make_assembly):
    make_assembly({str(WIRING)!r})  # shut down by the fixture
    assembly = schedkit.build(schedkit.load_wiring({str(WIRING)!r}))
    assembly["scheduler"].step()
"""
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_forgets_shutdown*",
            "*resources leaked by the test:",
            "*assembly built at test_a_test_that_forgets_shutdown_fails_naming_the_components.py:12"
            " was never shut down; components left running: *",
        ]
    )
    out = result.stdout.str()
    assert "kv_events_publisher (KvEventsPublisher)" in out
    assert "output_sender (OutputTally)" in out
    # The fixture's own assembly is not a leak. (The short summary, which pytest prints in
    # full when CI is set, repeats the message: count the report above it.)
    report = out.split("short test summary info")[0]
    assert report.count("was never shut down") == 1


def test_make_assembly_shuts_down_what_it_built(pytester):
    pytester.makepyfile(
        LOOPBACK
        + f"""
import zmq

from schedkit.core.schedule_batch import Req, SamplingParams

built = []

def test_builds(make_assembly):
    assembly = make_assembly({str(WIRING)!r})
    scheduler = assembly["scheduler"]
    scheduler.submit(Req(rid="a", origin_input_ids=[1, 2, 3],
                         sampling_params=SamplingParams(max_new_tokens=2)))
    scheduler.run_until_idle()
    assert assembly["output_sender"].output_tokens == 2
    built.append(assembly)

def test_was_shut_down():
    (assembly,) = built
    assert assembly["output_sender"].closed
    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.bind(assembly["kv_events_publisher"].endpoint)  # the publisher let go of its port
    sock.close(linger=0)
"""
    )
    pytester.runpytest(*QUIET).assert_outcomes(passed=2)


def test_leak_check_all_covers_tests_without_the_fixtures(pytester):
    pytester.makeini("[pytest]\nschedkit_leak_check = all\nschedkit_leak_check_timeout = 0.05\n")
    pytester.makepyfile(
        """
import threading

stop = threading.Event()

def test_leaves_a_thread():
    threading.Thread(target=stop.wait, name="left-over", daemon=True).start()

def test_clean():
    stop.set()
"""
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*daemon thread 'left-over' running Event.wait is still alive"])


@pytest.mark.parametrize(
    ("ini", "message"),
    [
        ("schedkit_leak_check = some", "schedkit_leak_check = 'some' is not valid; use one of:*"),
        ("schedkit_leak_check_timeout = -1", "*_timeout = '-1' is not valid; give seconds >= 0*"),
    ],
)
def test_bad_leak_check_options_are_usage_errors(pytester, ini, message):
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest(*QUIET)
    result.stderr.fnmatch_lines([f"*{message}"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_the_entry_point_plugin_lists_its_fixtures_in_an_empty_directory(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--fixtures", "-p", "no:cacheprovider", *QUIET],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "fixtures defined from schedkit.testing.plugin" in result.stdout, (
        "the pytest11 entry point 'schedkit = schedkit.testing.plugin' is not installed "
        "(pyproject.toml [project.entry-points.pytest11], then pip install -e .)\n"
        + result.stdout
        + result.stderr
    )
    assert "make_assembly -- " in result.stdout
    assert "assembly_leak_check -- " in result.stdout


def test_make_assembly_outside_a_checkout_builds_the_shipped_wiring(pytester):
    pytester.makepyfile(
        LOOPBACK
        + """
def test_default(make_assembly):
    assembly = make_assembly()
    assert assembly.wiring.sources[0].endswith("schedkit/wirings/wiring.yaml")
    assert assembly["scheduler"].max_running_requests == 256
"""
    )
    assert not (pytester.path / "wiring.yaml").exists()
    pytester.runpytest(*QUIET).assert_outcomes(passed=1)


def test_fake_component_fails_loudly_on_an_unconfigured_call(pytester):
    pytester.makepyfile(
        """
import pytest
from schedkit.testing import UnconfiguredCall

def test_loads(fake_component):
    inquirer = fake_component("load_inquirer", returns={"get_loads": {"num_running_reqs": 2}})
    assert inquirer.get_loads()["num_running_reqs"] == 2
    reporter = fake_component("metrics_reporter")
    reporter.on_pause()  # declared to return None: recorded
    assert reporter.calls_to("on_pause")
    with pytest.raises(UnconfiguredCall, match="returns=.'num_used_tokens'"):
        fake_component("load_inquirer").num_used_tokens()
    with pytest.raises(KeyError, match="keys: allocator"):
        fake_component("reporter")
"""
    )
    pytester.runpytest(*QUIET).assert_outcomes(passed=1)
