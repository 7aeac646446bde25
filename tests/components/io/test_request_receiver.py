import threading
import time

import pytest

from schedkit.components.io.io_struct import (
    ControlRequest,
)
from schedkit.components.io.request_receiver import InprocRequestReceiver
from schedkit.core.component import component_name
from schedkit.core.schedule_batch import Req


def test_registered_names():
    assert component_name(InprocRequestReceiver) == "inproc_request_receiver"


def test_inproc_receiver_drains_in_arrival_order():
    receiver = InprocRequestReceiver()
    assert receiver.recv_requests() == []
    a, b = Req(rid="a", origin_input_ids=[1]), Req(rid="b", origin_input_ids=[2])
    pause = ControlRequest(type="pause", mode="in_place")
    for item in (a, pause, b):
        receiver.put(item)
    assert receiver.recv_requests() == [a, pause, b]
    assert receiver.recv_requests() == []


def test_inproc_receiver_rejects_other_objects():
    receiver = InprocRequestReceiver()
    with pytest.raises(TypeError, match="Req or a ControlRequest, got dict"):
        receiver.put({"rid": "a"})


def test_inproc_receiver_wait_wakes_on_put_from_another_thread():
    receiver = InprocRequestReceiver()
    assert receiver.wait(0.01) is False
    req = Req(rid="a", origin_input_ids=[1])
    timer = threading.Timer(0.05, receiver.put, args=(req,))
    timer.start()
    start = time.monotonic()
    assert receiver.wait(5.0) is True
    assert time.monotonic() - start < 4.0
    assert receiver.recv_requests() == [req]
    assert receiver.wait(0.0) is False
    timer.join()


def test_inproc_receiver_close_drops_queued_items():
    receiver = InprocRequestReceiver()
    receiver.put(Req(rid="a", origin_input_ids=[1]))
    receiver.close()
    assert receiver.recv_requests() == []
