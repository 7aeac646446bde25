import threading
from pathlib import Path

import pytest
import zmq

from schedkit import build, component, load_wiring
from schedkit.testing import LeakCheck, LeakError

WIRING = Path(__file__).resolve().parents[3] / "wiring.yaml"


@component("testing_leaky_socket_owner")
class LeakySocketOwner:
    """Binds a PULL socket and forgets to close it at shutdown."""

    socket: zmq.Socket = None

    def __attrs_post_init__(self) -> None:
        self.socket = zmq.Context.instance().socket(zmq.PULL)
        self.socket.bind("tcp://127.0.0.1:0")

    def shutdown(self) -> None:
        pass


@pytest.fixture
def loopback_kv_events(monkeypatch):
    monkeypatch.setenv("SCHEDKIT_KV_EVENTS_ENDPOINT", "tcp://127.0.0.1:0")
    monkeypatch.setenv("SCHEDKIT_KV_REPLAY_ENDPOINT", "tcp://127.0.0.1:0")


@pytest.fixture
def check():
    """A started LeakCheck, finished at teardown if the test did not get that far."""
    leak_check = LeakCheck().start()
    yield leak_check
    if leak_check.active:
        leak_check.finish()


def _endpoint_is_free(endpoint):
    sock = zmq.Context.instance().socket(zmq.PUB)
    try:
        sock.bind(endpoint)
        return True
    except zmq.ZMQError:
        return False
    finally:
        sock.close(linger=0)


def test_an_assembly_never_shut_down_is_named_then_shut_down(loopback_kv_events, check):
    assert check.active
    before = set(threading.enumerate())
    assembly = build(load_wiring(WIRING))
    started = set(threading.enumerate()) - before
    endpoint = assembly["kv_events_publisher"].endpoint
    assert started and not _endpoint_is_free(endpoint)  # the publisher's thread and socket
    (problem,) = check.finish()
    assert not check.active
    assert problem.startswith(f"assembly built at {Path(__file__).relative_to(Path.cwd())}:")
    assert "was never shut down; components left running: " in problem
    assert "kv_events_publisher (KvEventsPublisher)" in problem
    assert "request_receiver (InprocRequestReceiver)" in problem
    assert "the leak check shut it down" in problem
    assert assembly["output_sender"].closed
    assert not any(thread.is_alive() for thread in started)
    assert _endpoint_is_free(endpoint)


def test_a_clean_block_reports_nothing(loopback_kv_events):
    # __exit__ raises LeakError if anything was left behind
    with LeakCheck() as check, build(load_wiring(WIRING)) as assembly:
        assembly["scheduler"].step()
    with pytest.raises(RuntimeError, match="without start"):
        check.finish()


def test_sockets_contexts_and_threads_left_behind_are_each_named():
    stop = threading.Event()
    context = zmq.Context()
    with pytest.raises(LeakError) as info, LeakCheck(join_timeout=0.05):
        sock = context.socket(zmq.PUSH)
        sock.bind("tcp://127.0.0.1:0")
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        thread = threading.Thread(target=stop.wait, name="forgotten", daemon=True)
        thread.start()
    stop.set()
    thread.join()
    sock.close()
    context.term()
    message = str(info.value)
    assert message.startswith("resources leaked by the test:\n")
    here = Path(__file__).relative_to(Path.cwd())
    assert f"PUSH socket ({endpoint}) created by {here}:" in message
    assert "daemon thread 'forgotten' running Event.wait is still alive" in message
    assert "ZeroMQ context" not in message  # created before the check began


def test_a_socket_a_component_forgets_to_close_names_the_component(check):
    wiring = {"components": {"leaky": {"type": "testing_leaky_socket_owner"}}}
    with build(wiring) as assembly:
        leaky = assembly["leaky"]
    problems = check.finish()
    leaky.socket.close()
    (problem,) = problems
    assert problem.startswith("PULL socket (tcp://127.0.0.1:")
    assert (
        "created by component leaky (LeakySocketOwner) at tests/schedkit/testing/test_leaks.py:"
        in problem
    )


def test_a_context_never_terminated_is_named(check):
    context = zmq.Context()
    problems = check.finish()
    context.term()
    assert len(problems) == 1
    assert problems[0].startswith("ZeroMQ context created by tests/schedkit/testing/test_leaks.py:")


def test_the_check_restores_what_it_wrapped():
    init = zmq.Socket.__dict__["__init__"]
    check = LeakCheck().start()
    try:
        assert zmq.Socket.__dict__["__init__"] is not init
        with pytest.raises(RuntimeError, match="called twice"):
            check.start()
    finally:
        check.finish()
    assert zmq.Socket.__dict__["__init__"] is init
