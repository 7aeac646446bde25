"""seed_router_ids: the first automatic routing id of a new ROUTER is no longer the one an
unseeded rand() gives every process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's rand() sequence is assumed"
)

FIRST_AUTOMATIC_ID = """
import ctypes, json, sys, zmq
from schedkit.endpoints import seed_router_ids
libc = ctypes.CDLL(None)
libc.srand(1)  # rand()'s state at process start, as glibc defines it
low, high = libc.rand(), libc.rand()
libc.srand(1)
unseeded = (b"\\x00" + (low | (high << 31) & 0xFFFFFFFF).to_bytes(4, "big")).hex()
seeded = seed_router_ids() if sys.argv[1] == "seed" else None
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER)
router.bind("tcp://127.0.0.1:0")
dealer = ctx.socket(zmq.DEALER)
dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
dealer.send(b"x")
print(json.dumps([seeded, unseeded, router.recv_multipart()[0].hex()]))
dealer.close(linger=0)
router.close(linger=0)
ctx.term()
"""


def first_automatic_id(mode: str) -> list:
    result = subprocess.run(
        [sys.executable, "-c", FIRST_AUTOMATIC_ID, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)


def test_unseeded_the_first_automatic_routing_id_is_predictable():
    _, predicted, first = first_automatic_id("plain")
    assert first == predicted


def test_seed_router_ids_makes_it_unpredictable():
    runs = [first_automatic_id("seed") for _ in range(2)]
    assert all(seeded is True and first != predicted for seeded, predicted, first in runs)
    assert runs[0][2] != runs[1][2]
