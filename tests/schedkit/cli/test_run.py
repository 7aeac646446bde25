"""``schedkit run`` as a router sees it: the endpoints it announces, free ports when the
configured ones are taken, a stream that stays up after the run, a stable batch count."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from schedkit.kv_events import AllBlocksCleared, KvEventSubscriber, KvIndex

ROOT = Path(__file__).resolve().parents[3]


def taken_port() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_run_moves_to_free_ports_and_lingers_for_a_router():
    holders = [taken_port(), taken_port()]
    ports = [h.getsockname()[1] for h in holders]
    env = {
        **os.environ,
        "SCHEDKIT_KV_EVENTS_ENDPOINT": f"tcp://127.0.0.1:{ports[0]}",
        "SCHEDKIT_KV_REPLAY_ENDPOINT": f"tcp://127.0.0.1:{ports[1]}",
    }
    command = [sys.executable, "-m", "schedkit.cli", "run", "wiring.yaml", "--json"]
    command += ["--num-requests", "30", "--kv-events-linger", "30"]
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        lines = []
        while not lines or "stay up" not in lines[-1]:
            line = proc.stderr.readline()
            assert line, f"schedkit run ended early: {''.join(lines)}"
            lines.append(line)
        text = "".join(lines)
        assert f"tcp://127.0.0.1:{ports[0]}" in text and "move to free ports" in text
        live, replay = re.search(r"KV events on ([^\s,]+), replay on (\S+)", text).groups()
        assert not live.endswith(f":{ports[0]}") and not replay.endswith(f":{ports[1]}")
        accepted = int(re.search(r"\((\d+) batches\)", text).group(1))

        # A router that shows up after the run still gets the whole stream from seq 0.
        index, got = KvIndex(), []
        with KvEventSubscriber(live, replay, topic="kv-events") as sub:
            deadline = time.monotonic() + 20
            while len(got) < accepted:
                assert time.monotonic() < deadline, f"got {len(got)} of {accepted} batches"
                for seq, batch in sub.poll(50):
                    got.append(seq)
                    index.apply(batch)
                    if seq == 0:
                        assert batch.events[0] == AllBlocksCleared()
        assert [s for s in got if s < accepted] == list(range(accepted))
        assert index.blocks(0)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        for holder in holders:
            holder.close()
    assert proc.returncode == 0
    summary = json.loads(out)
    assert summary["kv_events_published"] == accepted


def test_the_batch_count_is_the_same_every_run():
    def published() -> int:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "schedkit.cli",
                "run",
                "wiring.yaml",
                "--json",
                "--seed",
                "3",
                "--num-requests",
                "100",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={
                **os.environ,
                "SCHEDKIT_KV_EVENTS_ENDPOINT": "tcp://127.0.0.1:0",
                "SCHEDKIT_KV_REPLAY_ENDPOINT": "tcp://127.0.0.1:0",
            },
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["kv_events_published"]

    assert published() == published() > 0
