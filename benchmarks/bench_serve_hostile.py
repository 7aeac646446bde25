"""What hostile loopback clients cost a real ``schedkit serve`` (``wiring.yaml`` with
``examples/serve.yaml``, default ``zmq_server`` limits): peak memory (VmHWM) and latencies.

In order: the server idle; a well-behaved request (60 prompt tokens, 16 new) at idle; the
refusal of a 1,001-byte frame of nested arrays and of a 32 MiB frame of empty arrays; a client
that floods N requests of 32k tokens (reading its refusals) while a well-behaved request is
sent; the flood client leaving (its accepted requests aborted, KV freed); a well-behaved
request after it; a well-behaved request while another client sends 1 MiB frames that fail
validation at their last token id as fast as it can. Each latency is from send to the answer
(ErrorReply, or final output).

Then, each repeated ``--repeat`` times (min / median / max): a small request at idle and
behind another client's flood of N requests (with one step, a full 8,192-token prefill chunk,
for the bound "2 x idle + one step"); the serve process's CPU over one second with 1,000 idle
connections and the latency of a newcomer then; peak memory (VmHWM) of a fresh serve under 48
connections each holding a 32 MiB frame minus one byte, or an 8 MiB one (the largest frame it
keeps), and under a message of endless "more" frames.

Usage: ``python benchmarks/bench_serve_hostile.py [--quick] [--repeat N]`` (``--quick``: a
flood of 100, one repeat, 12 frame holders). Linux only (reads /proc/PID/status and /proc/PID/stat).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import zmq

from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    ErrorReply,
    GenerateReqInput,
    SamplingParamsInput,
    decode_server_message,
    encode,
)
from schedkit.components.io.zmtp import GREETING, command, frame_header
from schedkit.testing.serving import peak_rss_mib, start_serve


class Client:
    """A DEALER that counts what comes back."""

    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.errors = 0
        self.finished: set[str] = set()
        self.replies: list[ControlReply] = []

    def pump(self, timeout_ms: int) -> None:
        """Count what arrives, waiting up to ``timeout_ms`` for the first message."""
        while self.sock.poll(timeout_ms):
            timeout_ms = 0
            msg = decode_server_message(self.sock.recv())
            if isinstance(msg, ErrorReply):
                self.errors += 1
            elif isinstance(msg, ControlReply):
                self.replies.append(msg)
            elif isinstance(msg, BatchTokenIDOutput):
                self.finished.update(
                    r for r, f in zip(msg.rids, msg.finished_reasons, strict=True) if f
                )

    def until(self, done, timeout: float = 120.0) -> float:
        """Pump until ``done()``; the seconds it took."""
        started = time.monotonic()
        while not done():
            if time.monotonic() - started > timeout:
                raise SystemExit("bench_serve_hostile: the server stopped answering")
            self.pump(5)
        return time.monotonic() - started

    def request(self, rid: str, prompt: int = 60, new: int = 16) -> float:
        """Send a request and wait for its final output; the seconds it took."""
        params = SamplingParamsInput(max_new_tokens=new)
        if prompt > 60:  # a prompt of its own, nothing cached
            ids = [(hash(rid) + 7919 * j) % 30000 + 10 for j in range(prompt)]
        else:
            ids = [5] * (prompt - 10) + [hash(rid) % 1000] * 10
        self.sock.send(encode(GenerateReqInput(rid=rid, input_ids=ids, sampling_params=params)))
        return self.until(lambda: rid in self.finished)

    def refusal(self, payload: bytes) -> float:
        """Send ``payload`` and wait for its ErrorReply; the seconds it took."""
        before = self.errors
        self.sock.send(payload)
        return self.until(lambda: self.errors > before)


def request_under_invalid_frames(endpoint: str, good: Client) -> float:
    """A well-behaved request's latency while another client sends, as fast as it can and
    never reading, 1 MiB frames that fail validation only at their last token id."""
    ids = [70_000] * ((1 << 20) // 5 - 1) + [2**32]
    frame = msgspec.msgpack.encode({"kind": "generate", "rid": "jam", "input_ids": ids})
    stop = threading.Event()

    def jam() -> None:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        while not stop.is_set():
            try:
                sock.send(frame, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                time.sleep(0.001)
        sock.close()

    jammer = threading.Thread(target=jam)
    jammer.start()
    try:
        time.sleep(1.0)
        return good.request("jammed")
    finally:
        stop.set()
        jammer.join()


def raw_peer(endpoint: str) -> socket.socket:
    """A plain TCP socket that completed the ZMTP handshake as a DEALER."""
    host, port = endpoint[len("tcp://") :].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(GREETING + command(b"READY", {b"Socket-Type": b"DEALER"}))
    return sock


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (USER_HZ 100)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def spread(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    """``min / median / max`` of ``values`` times ``scale``."""
    shown = (min(values), statistics.median(values), max(values))
    return " / ".join(f"{v * scale:.{digits}f}" for v in shown)


def flood_behind(endpoint: str, good: Client, flood_size: int, rid: str) -> float:
    """A small request's latency sent right after another client's flood of ``flood_size``
    32k-token requests; the flood client then leaves and its requests go."""
    prompt = [1000 + (j * 7919) % 60000 for j in range(32 << 10)]
    flood = Client(endpoint)
    for i in range(flood_size):
        flood.sock.send(encode(GenerateReqInput(rid=f"{rid}-f{i}", input_ids=prompt)))
        flood.pump(0)
    flood.sock.send(encode(ControlReq(type="get_loads")))
    flood.until(lambda: flood.replies)  # every flood request was read (taken or refused)
    latency = good.request(rid)
    flood.sock.close()
    while True:
        good.sock.send(encode(ControlReq(type="get_loads")))
        good.until(lambda: good.replies)
        loads = good.replies.pop().loads
        if loads["num_running_reqs"] + loads["num_waiting_reqs"] == 0:
            return latency


def repeated(flood_size: int, repeat: int, holders: int, row: str) -> None:
    """The repeated figures of the module docstring."""
    server, endpoint = start_serve(stderr=subprocess.DEVNULL, max_open_files=1024)
    try:
        json.loads(server.stdout.readline())
        good = Client(endpoint)
        step = [good.request(f"step{i}", prompt=8192, new=1) for i in range(repeat)]
        idle = [good.request(f"idle-r{i}") for i in range(repeat)]
        behind = [flood_behind(endpoint, good, flood_size, f"behind{i}") for i in range(repeat)]
        print(row.format("one step: 8,192-token prefill (ms)", spread(step, 1e3)))
        print(row.format("small request at idle (ms)", spread(idle, 1e3)))
        print(
            row.format(
                f"small request behind a {flood_size}-request flood (ms)", spread(behind, 1e3)
            )
        )
        bound = 2 * statistics.median(idle) + statistics.median(step)
        print(row.format("  bound 2 x idle + one step, medians (ms)", f"{bound * 1e3:.1f}"))
        cpu, newcomer = [], []
        for i in range(repeat):
            idle_socks = [raw_peer(endpoint) for _ in range(1000)]
            time.sleep(0.5)
            before = cpu_seconds(server.pid)
            time.sleep(1.0)
            cpu.append(cpu_seconds(server.pid) - before)
            newcomer.append(Client(endpoint).request(f"newcomer{i}"))
            for sock in idle_socks:
                sock.close()
        print(row.format("1,000 idle connections: serve CPU (% of a core)", spread(cpu, 100, 0)))
        print(row.format("  a newcomer's small request (ms)", spread(newcomer, 1e3)))
    finally:
        server.terminate()
        server.wait(30)
    frames, largest, more = [], [], []
    for _ in range(repeat):
        frames.append(attack_peak(32 << 20, holders))
        largest.append(attack_peak((8 << 20) - 1, holders))
        more.append(attack_peak(None, holders))
    print(row.format(f"{holders} x 32 MiB frames held: peak RSS (MiB)", spread(frames, digits=0)))
    print(
        row.format(
            f"{holders} x 8 MiB frames (largest kept) held: peak RSS (MiB)",
            spread(largest, digits=0),
        )
    )
    print(row.format('endless "more" frames: peak RSS (MiB)', spread(more, digits=0)))


def attack_peak(frame_bytes: int | None, holders: int) -> float:
    """A fresh serve's peak RSS under ``holders`` connections each sending a frame of
    ``frame_bytes`` but its last byte, or (None) one connection sending 12 M empty frames
    flagged "more"."""
    with tempfile.TemporaryFile("w+") as log:
        server, endpoint = start_serve(stderr=log)
        peers: list[socket.socket] = []
        try:
            if not server.stdout.readline():
                log.seek(0)
                raise SystemExit(f"bench_serve_hostile: serve did not start:\n{log.read()[-3000:]}")
            if frame_bytes is not None:
                size = frame_bytes
                for _ in range(holders):
                    peers.append(raw_peer(endpoint))
                    with contextlib.suppress(OSError):  # closed by the server
                        peers[-1].sendall(frame_header(size) + bytes(size - 1))
            else:
                peers.append(raw_peer(endpoint))
                chunk = b"\x01\x00" * (1 << 20)
                with contextlib.suppress(OSError):  # closed by the server
                    for _ in range(12):
                        peers[-1].sendall(chunk)
            Client(endpoint).request("after")  # still serving
            return peak_rss_mib(server.pid)
        finally:
            for sock in peers:
                sock.close()
            server.terminate()
            server.wait(30)


def main() -> None:
    """Start a serve, run the steps in the module docstring, print a figure a line."""
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="flood 100 requests, not 1,000")
    parser.add_argument(
        "--repeat", type=int, help="repeats of the repeated figures (5; 1 with --quick)"
    )
    args = parser.parse_args()
    flood_size = 100 if args.quick else 1000
    repeat = args.repeat or (1 if args.quick else 5)
    server, endpoint = start_serve(stderr=subprocess.DEVNULL)
    try:
        json.loads(server.stdout.readline())
        row = "{:<52} {:>10}"
        print(row.format("server idle: peak RSS (MiB)", f"{peak_rss_mib(server.pid):.0f}"))
        good, hostile = Client(endpoint), Client(endpoint)
        idle = sorted(good.request(f"idle{i}") for i in range(5))[2]
        print(row.format("well-behaved request at idle (ms, median of 5)", f"{idle * 1e3:.1f}"))
        deep = hostile.refusal(b"\x91" * 1000 + b"\x00")
        print(row.format("1,001-byte nested frame refused in (ms)", f"{deep * 1e3:.1f}"))
        n = (32 << 20) - 5
        big = hostile.refusal(b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n)
        print(row.format("32 MiB frame of [] refused in (ms)", f"{big * 1e3:.1f}"))
        print(row.format("peak RSS after the frames (MiB)", f"{peak_rss_mib(server.pid):.0f}"))

        prompt = [1000 + (j * 7919) % 60000 for j in range(32 << 10)]
        refused_before = hostile.errors
        started = time.monotonic()
        for i in range(flood_size):
            hostile.sock.send(encode(GenerateReqInput(rid=f"f{i}", input_ids=prompt)))
            hostile.pump(0)
        # The reply to a control message comes after the refusals of everything sent before.
        hostile.sock.send(encode(ControlReq(type="get_loads")))
        hostile.until(lambda: hostile.replies)
        answered = time.monotonic() - started
        during = good.request("during")
        refused = hostile.errors - refused_before
        print(
            row.format(
                f"flood of {flood_size} x 32k tokens: refused / taken",
                f"{refused} / {flood_size - refused}",
            )
        )
        print(row.format("  all refusals answered in (s)", f"{answered:.2f}"))
        print(row.format("  well-behaved request sent then (s)", f"{during:.2f}"))
        print(row.format("  peak RSS (MiB)", f"{peak_rss_mib(server.pid):.0f}"))
        hostile.sock.close()
        left = time.monotonic()
        while True:
            good.sock.send(encode(ControlReq(type="get_loads")))
            good.until(lambda: good.replies)
            loads = good.replies.pop().loads
            if loads["num_running_reqs"] + loads["num_waiting_reqs"] == 0:
                break
        print(
            row.format(
                "flood client left: its requests gone in (ms)",
                f"{(time.monotonic() - left) * 1e3:.0f}",
            )
        )
        after = sorted(good.request(f"after{i}") for i in range(5))[2]
        print(row.format("well-behaved request afterwards (ms, median of 5)", f"{after * 1e3:.1f}"))
        jammed = request_under_invalid_frames(endpoint, good)
        print(row.format("well-behaved request under 1 MiB invalid frames (s)", f"{jammed:.2f}"))
        print(row.format("peak RSS of the whole run (MiB)", f"{peak_rss_mib(server.pid):.0f}"))
        good.sock.close()
    finally:
        server.terminate()
        server.wait(30)
    repeated(flood_size, repeat, 12 if args.quick else 48, row)


if __name__ == "__main__":
    main()
