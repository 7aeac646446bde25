"""unpredictable_routing_ids: a ROUTER's automatic peer ids no longer start where every
process's start."""

from __future__ import annotations

import subprocess
import sys

# Prints the automatic routing id of a ROUTER's first anonymous peer, in a fresh process.
FIRST_ID = """
import sys
import zmq
from schedkit.endpoints import unpredictable_routing_ids
for _ in range(int(sys.argv[1])):
    unpredictable_routing_ids()
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER)
port = router.bind_to_random_port("tcp://127.0.0.1")
client = ctx.socket(zmq.DEALER)
client.connect(f"tcp://127.0.0.1:{port}")
client.send(b"x")
print(router.recv_multipart()[0].hex())
ctx.destroy(linger=0)
"""


def first_id(calls: int) -> str:
    done = subprocess.run(
        [sys.executable, "-c", FIRST_ID, str(calls)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def test_automatic_routing_ids_are_predictable_unless_seeded():
    assert first_id(0) == first_id(0) == "006b8b4567"  # what a hostile client would claim
    seeded = {first_id(1), first_id(2), first_id(2)}  # idempotent: a second call is harmless
    assert "006b8b4567" not in seeded
    assert len(seeded) == 3 and all(len(i) == 10 and i.startswith("00") for i in seeded)
