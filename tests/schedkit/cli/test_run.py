"""``schedkit run`` as a router sees it: the endpoints it announces, free ports when the
configured ones are taken (also by a run started at the same moment), a stream that stays up
after the run, a stable batch count."""

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
# Pairs of runs started together in the paired-start test (set higher to stress it).
PAIRED_STARTS = int(os.environ.get("SCHEDKIT_PAIRED_STARTS", "3"))


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
    assert summary["kv_event_batches_published"] == accepted


def free_port_pair() -> list[int]:
    holders = [taken_port(), taken_port()]
    ports = [h.getsockname()[1] for h in holders]
    for holder in holders:
        holder.close()
    return ports


def test_runs_started_together_on_the_same_ports_both_succeed():
    # Several times, two runs configured for the same KV-event ports start at the same moment:
    # one binds them, the other finds them taken by its own bind and moves to free ports.
    command = [sys.executable, "-m", "schedkit.cli", "run", "wiring.yaml", "--json"]
    command += ["--num-requests", "5"]
    for _ in range(PAIRED_STARTS):
        ports = free_port_pair()
        env = {
            **os.environ,
            "SCHEDKIT_KV_EVENTS_ENDPOINT": f"tcp://127.0.0.1:{ports[0]}",
            "SCHEDKIT_KV_REPLAY_ENDPOINT": f"tcp://127.0.0.1:{ports[1]}",
        }
        pair = [
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        moved = []
        for proc in pair:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            assert json.loads(out)["requests_done"] == 5
            endpoints = re.search(r"KV events on ([^\s,]+), replay on (\S+)", err).groups()
            moved.append((endpoints, "move to free ports" in err))
        # A run that found the ports taken announces others (a run that started after the
        # other one ended may take the configured ports itself).
        (first, first_moved), (second, second_moved) = moved
        assert not (first_moved and second_moved)
        if first_moved or second_moved:
            assert not set(first) & set(second)


def test_the_batch_count_is_the_same_every_run():
    command = [sys.executable, "-m", "schedkit.cli", "run", "wiring.yaml", "--json"]
    command += ["--seed", "3", "--num-requests", "100"]
    env = {
        **os.environ,
        "SCHEDKIT_KV_EVENTS_ENDPOINT": "tcp://127.0.0.1:0",
        "SCHEDKIT_KV_REPLAY_ENDPOINT": "tcp://127.0.0.1:0",
    }
    # The two runs go side by side: the count must not depend on what else the machine does.
    runs = [
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    published = []
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        published.append(json.loads(out)["kv_event_batches_published"])
    assert published[0] == published[1] > 0


def test_run_json_keys_carry_units_and_echo_what_produced_them(tmp_path):
    from schedkit import __version__
    from schedkit.sim.run_summary import JSON_KEYS

    overlay = tmp_path / "o.yaml"
    overlay.write_text("components:\n  scheduler:\n    args: {max_running_requests: 64}\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "schedkit.cli",
            "run",
            "wiring.yaml",
            "-o",
            str(overlay),
            "--json",
            "--num-requests",
            "20",
            "--rate",
            "8",
            "--seed",
            "3",
            "--model",
            "llama3-8b",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={
            **os.environ,
            "SCHEDKIT_KV_EVENTS_ENDPOINT": "tcp://127.0.0.1:0",
            "SCHEDKIT_KV_REPLAY_ENDPOINT": "tcp://127.0.0.1:0",
        },
    )
    summary = json.loads(result.stdout)
    assert summary.pop("run") == {
        "schedkit_version": __version__,
        "wiring": "wiring.yaml",
        "overlays": [str(overlay)],
        "preset": {"model": "llama3-8b", "gpu": None, "tp": None, "model_limits": "off"},
        "workload": "synthetic:chat",
        "format": None,
        "num_requests": 20,
        "rate": 8.0,
        "seed": 3,
        "speedup": None,
    }
    assert list(summary) == [key for key, _, _ in JSON_KEYS.values()]
    assert {"ttft_p90_s", "peak_rss_mib", "wall_s", "simulated_s"} <= set(summary)


def test_version():
    from schedkit import __version__

    result = subprocess.run(
        [sys.executable, "-m", "schedkit.cli", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout == f"schedkit {__version__}\n"


def test_serve_moves_kv_events_off_a_busy_port_and_names_the_shipped_overlay(tmp_path):
    from schedkit.testing import free_endpoint

    holder = taken_port()
    busy = f"tcp://127.0.0.1:{holder.getsockname()[1]}"
    env = {
        **os.environ,
        "SCHEDKIT_REQUEST_ENDPOINT": free_endpoint(),
        "SCHEDKIT_KV_EVENTS_ENDPOINT": busy,
        "SCHEDKIT_KV_REPLAY_ENDPOINT": free_endpoint(),
    }
    command = [sys.executable, "-m", "schedkit.cli", "serve"]
    refused = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert refused.returncode == 2
    assert (
        "add the shipped serve overlay (a zmq_server, the wall clock): schedkit serve -o serve"
        in refused.stderr
    )
    server = subprocess.Popen(
        [*command, "-o", "serve"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = json.loads(server.stdout.readline())["ready"]
        assert ready["kv_events"].startswith("tcp://127.0.0.1:") and ready["kv_events"] != busy
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=30)
        holder.close()
    assert f"schedkit serve: {busy} in use; KV events move to free ports" in err
    assert server.returncode == 0
