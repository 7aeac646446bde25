"""The HTTP front end against the ZeroMQ edge it sits on, in one run of one ``schedkit serve
--http`` with the simulated runner's cost set to zero (``zero_cost``), so that the edges are
what is measured.

Per round, in alternating order, each side runs two saturation phases: short non-streamed
requests (16 prompt tokens, 4 new, ``--concurrency`` at once) and streamed requests (16 prompt
tokens, 256 new, one message per token, ``--streams`` at once). The HTTP side is a raw asyncio
HTTP/1.1 keep-alive client (OpenAI ``/v1/completions``); the ZeroMQ side a DEALER on the
scheduler's internal endpoint. Printed: requests/s, tokens/s and the serving processes' CPU
time (user + system, from /proc): the scheduler process, plus the front-end process for HTTP,
per request and per token, min / median / max over the rounds, and the HTTP / ZMQ ratio of
each round's pair.

At saturation the two sides run at different rates (the ZeroMQ side several times faster), and
a zero-cost scheduler spends more CPU per request at a lower rate (fewer requests per step), so
the saturated ratio charges HTTP for the scheduler's own step overhead too. Then, at half the
median saturated HTTP request rate, both sides get the same Poisson arrivals of short requests
(one phase of ``--seconds`` per side per round, alternating): p50 / p99 latency per round and
what HTTP adds, and CPU per request at that equal rate, where the scheduler does the same work
on both sides and the ratio is the edge's.

Wall-clock rates depend on what else runs on the machine; CPU per request does much less. So
beside them each phase prints a capacity from CPU alone: requests (and tokens) per second per
core of serving CPU (1e6 / the serving processes' CPU us per request: what one core running
the whole server would serve), and with one core per serving process (the slowest process's
1e6 / its CPU us per request: the scheduler's alone on the ZeroMQ side, the lesser of the
scheduler's and the front end's for HTTP), the targets read against both. The machine's load
average is printed at the start and the end.

Usage: ``python benchmarks/bench_http.py [--rounds 5] [--seconds 3]``. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

import msgspec
import zmq

from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    GenerateReqInput,
    SamplingParamsInput,
    decode_server_message,
    encode,
)
from schedkit.testing.serving import start_http_serve, stop_serve

PROMPT_TOKENS = 16
SHORT, STREAM = 4, 256
# Connections of the HTTP side's Poisson phase (as a load generator's pool).
OPEN_LOOP_CONNECTIONS = 128
TARGETS = (
    "targets: >= 1,000 short requests/s, >= 50,000 streamed tokens/s, HTTP CPU <= 2x ZMQ per token"
)
TARGET_REQUESTS, TARGET_TOKENS = 1_000, 50_000


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _prompts(rng: random.Random, n: int = 512) -> list[list[int]]:
    return [[rng.randrange(256, 32000) for _ in range(PROMPT_TOKENS)] for _ in range(n)]


def _http_request(host: str, port: int, prompt: list[int], new: int, stream: bool) -> bytes:
    body = json.dumps(
        {"prompt": prompt, "max_tokens": new, "stream": stream, "ignore_eos": True}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _http_exchange(reader, writer, request: bytes, stream: bool) -> None:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"HTTP error: {head[:200]!r}")
    if stream:
        # Reads as they come, looking only at the end for the last chunk (SSE data ends with
        # a blank line, so only the terminator ends with CRLF 0 CRLF CRLF): a search of the
        # whole buffer on each arrival would cost the client more than the servers.
        tail = b""
        while not tail.endswith(b"\r\n0\r\n\r\n"):
            data = await reader.read(1 << 16)
            if not data:
                raise RuntimeError("the stream ended before its last chunk")
            tail = (tail + data)[-32:]
        if b"data: [DONE]" not in tail:
            raise RuntimeError(f"the stream did not end with data: [DONE]: {tail!r}")
    else:
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)


class Http:
    """The HTTP side: keep-alive connections to the front end."""

    def __init__(self, url: str, prompts: list[list[int]]) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)
        self.requests = {
            (new, stream): [_http_request(host, int(port), p, new, stream) for p in prompts]
            for new, stream in ((SHORT, False), (STREAM, True))
        }

    async def connect(self):
        return await asyncio.open_connection(self.host, self.port, limit=1 << 22)

    async def saturate(self, new: int, stream: bool, concurrency: int, seconds: float) -> int:
        requests, done = self.requests[new, stream], 0
        deadline = time.perf_counter() + seconds

        async def worker(i: int) -> None:
            nonlocal done
            reader, writer = await self.connect()
            while time.perf_counter() < deadline:
                await _http_exchange(reader, writer, requests[(done + i) % len(requests)], stream)
                done += 1
            writer.close()

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return done

    async def open_loop(self, arrivals: list[float]) -> list[float]:
        requests, pool, latencies = self.requests[SHORT, False], [], []
        for _ in range(OPEN_LOOP_CONNECTIONS):
            pool.append(await self.connect())
        start = time.perf_counter()

        free = asyncio.Queue()
        for conn in pool:
            free.put_nowait(conn)

        async def one(i: int, at: float) -> None:
            conn = await free.get()  # waiting for a connection counts in the latency
            await _http_exchange(*conn, requests[i % len(requests)], False)
            latencies.append(time.perf_counter() - start - at)
            free.put_nowait(conn)

        tasks = []
        for i, at in enumerate(arrivals):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(i, at)))
        await asyncio.gather(*tasks)
        for _, writer in pool:
            writer.close()
        return latencies


class Zmq:
    """The ZeroMQ side: one DEALER on the scheduler's edge."""

    def __init__(self, endpoint: str, prompts: list[list[int]]) -> None:
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.prompts = prompts
        self.counter = 0

    def _send(self, new: int, stream: bool) -> str:
        self.counter += 1
        rid = f"z{self.counter}"
        params = SamplingParamsInput(max_new_tokens=new, stream=stream, ignore_eos=True)
        prompt = self.prompts[self.counter % len(self.prompts)]
        self.socket.send(
            encode(GenerateReqInput(rid=rid, input_ids=prompt, sampling_params=params))
        )
        return rid

    def _finished(self, timeout_ms: int) -> list[str]:
        finished = []
        if self.socket.poll(timeout_ms):
            while self.socket.poll(0):
                msg = decode_server_message(self.socket.recv())
                if not isinstance(msg, BatchTokenIDOutput):
                    raise RuntimeError(f"ZeroMQ edge answered {msgspec.to_builtins(msg)}")
                finished += [
                    r for r, f in zip(msg.rids, msg.finished_reasons, strict=True) if f is not None
                ]
        return finished

    def saturate(self, new: int, stream: bool, concurrency: int, seconds: float) -> int:
        deadline = time.perf_counter() + seconds
        live = {self._send(new, stream) for _ in range(concurrency)}
        done = 0
        while live:
            for rid in self._finished(1000):
                live.discard(rid)
                done += 1
                if time.perf_counter() < deadline:
                    live.add(self._send(new, stream))
        return done

    def open_loop(self, arrivals: list[float]) -> list[float]:
        start, sent, latencies, i = time.perf_counter(), {}, [], 0
        while i < len(arrivals) or sent:
            now = time.perf_counter() - start
            while i < len(arrivals) and arrivals[i] <= now:
                sent[self._send(SHORT, False)] = arrivals[i]
                i += 1
            wait = 0 if i >= len(arrivals) else max(0.0, arrivals[i] - now)
            for rid in self._finished(max(0, int(wait * 1000)) if i < len(arrivals) else 1000):
                latencies.append(time.perf_counter() - start - sent.pop(rid))
        return latencies


def _run(coroutine):
    """Run the HTTP client on uvloop when it is installed (the front end's own loop), else on
    asyncio's: the client's CPU per token then stays well under the servers'."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _ratios(http: list[float], zmq_: list[float]) -> list[float]:
    return [h / z for h, z in zip(http, zmq_, strict=True)]


def _mmm(values: list[float], fmt: str = "{:,.0f}") -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _print_capacity(rows: dict[tuple[str, str], dict[str, list[float]]]) -> None:
    """Capacity from CPU per request, and the targets read against it and the wall clock."""
    print(
        "capacity from CPU alone (robust to other load on the machine): per core of serving "
        "CPU, and with one core per serving process (min / median / max of the rounds)"
    )
    print(
        "| phase | edge | requests/s per core | tokens/s per core "
        "| requests/s, a core per process | tokens/s, a core per process |"
    )
    print("|---|---|---|---|---|---|")
    for (kind, side), row in rows.items():
        per_token = SHORT if kind == "short" else STREAM
        core, process = row["capacity/core"], row["capacity/process"]
        print(
            f"| {kind} | {side} | {_mmm(core)} | {_mmm([per_token * v for v in core])} "
            f"| {_mmm(process)} | {_mmm([per_token * v for v in process])} |"
        )
    for kind, unit, target, scale in (
        ("short", "requests/s", TARGET_REQUESTS, 1),
        ("stream", "tokens/s", TARGET_TOKENS, STREAM),
    ):
        row = rows[kind, "http"]
        wall = row["req/s" if kind == "short" else "tok/s"]
        core = [scale * v for v in row["capacity/core"]]
        process = [scale * v for v in row["capacity/process"]]
        verdicts = ", ".join(
            f"{name} met in {sum(v >= target for v in values)} of {len(values)} rounds"
            for name, values in (("wall clock", wall), ("per core", core))
        )
        print(
            f"target >= {target:,} HTTP {kind} {unit}: wall clock {_mmm(wall)}, per core "
            f"{_mmm(core)}, a core per process {_mmm(process)}; {verdicts}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--streams", type=int, default=32)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        overlay = Path(tmp) / "zero_cost.yaml"
        overlay.write_text("components:\n  model_runner:\n    args:\n      zero_cost: true\n")
        server, url, ready = start_http_serve("-o", str(overlay))
    load_start = os.getloadavg()
    try:
        front_end = int(
            Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()[0]
        )
        prompts = _prompts(random.Random(0))
        http, zmq_side = Http(url, prompts), Zmq(ready["requests"], prompts)
        rows: dict[tuple[str, str], dict[str, list[float]]] = {}
        for r in range(args.rounds):
            for side in ("http", "zmq") if r % 2 == 0 else ("zmq", "http"):
                for kind, new, stream, width in (
                    ("short", SHORT, False, args.concurrency),
                    ("stream", STREAM, True, args.streams),
                ):
                    sched0, front0 = _cpu(server.pid), _cpu(front_end)
                    client0 = _own_cpu()
                    t0 = time.perf_counter()
                    if side == "http":
                        done = _run(http.saturate(new, stream, width, args.seconds))
                    else:
                        done = zmq_side.saturate(new, stream, width, args.seconds)
                    wall = time.perf_counter() - t0
                    sched = _cpu(server.pid) - sched0
                    front = _cpu(front_end) - front0 if side == "http" else 0.0
                    client = _own_cpu() - client0
                    row = rows.setdefault((kind, side), {})
                    tokens = done * new
                    slowest = max(sched, front)
                    for name, value in (
                        ("capacity/core", done / (sched + front)),
                        ("capacity/process", done / slowest),
                        ("req/s", done / wall),
                        ("tok/s", tokens / wall),
                        ("scheduler", 1e6 * sched / done),
                        ("front end", 1e6 * front / done),
                        ("server", 1e6 * (sched + front) / done),
                        ("server/tok", 1e6 * (sched + front) / tokens),
                        ("client", 1e6 * client / done),
                    ):
                        row.setdefault(name, []).append(value)
        print(f"bench_http: {args.rounds} rounds of {args.seconds:g} s per phase, zero-cost runner")
        print(TARGETS)
        print(
            "CPU: user + system time of the serving processes (the scheduler process; for HTTP "
            "also the front-end process) over a phase, divided by the requests or tokens served"
        )
        print(
            "| phase | edge | requests/s | tokens/s | scheduler CPU us / request "
            "| front-end CPU us / request | server CPU us / token | client CPU us / request |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for (kind, side), row in rows.items():
            print(
                f"| {kind} | {side} | {_mmm(row['req/s'])} | {_mmm(row['tok/s'])} "
                f"| {_mmm(row['scheduler'])} | {_mmm(row['front end']) if side == 'http' else '-'} "
                f"| {_mmm(row['server/tok'], '{:.2f}')} | {_mmm(row['client'])} |"
            )
        for kind, unit in (("short", "request"), ("stream", "streamed token")):
            ratios = _ratios(rows[kind, "http"]["server"], rows[kind, "zmq"]["server"])
            print(
                f"saturated {kind}: HTTP / ZMQ server CPU per {unit} (pairs of one round, "
                f"min / median / max): {_mmm(ratios, '{:.2f}')}"
            )
        _print_capacity(rows)
        rate = statistics.median(rows["short", "http"]["req/s"]) / 2
        arrivals, t, rng = [], 0.0, random.Random(1)
        while t < args.seconds:
            t += rng.expovariate(rate)
            arrivals.append(t)
        equal: dict[str, dict[str, list[float]]] = {"http": {}, "zmq": {}}
        for r in range(args.rounds):
            for side in ("http", "zmq") if r % 2 == 0 else ("zmq", "http"):
                sched0, front0 = _cpu(server.pid), _cpu(front_end)
                if side == "http":
                    latencies = _run(http.open_loop(arrivals))
                else:
                    latencies = zmq_side.open_loop(arrivals)
                sched = _cpu(server.pid) - sched0
                front = _cpu(front_end) - front0 if side == "http" else 0.0
                row = equal[side]
                for name, value in (
                    ("p50", 1e3 * _pct(latencies, 0.5)),
                    ("p99", 1e3 * _pct(latencies, 0.99)),
                    ("scheduler", 1e6 * sched / len(arrivals)),
                    ("front end", 1e6 * front / len(arrivals)),
                    ("server", 1e6 * (sched + front) / len(arrivals)),
                ):
                    row.setdefault(name, []).append(value)
        print(
            f"short requests at {rate:,.0f} req/s (half the saturated HTTP rate), the same "
            f"Poisson arrivals on both edges, {len(arrivals):,} per phase, min / median / max "
            "of the rounds:"
        )
        h, z = equal["http"], equal["zmq"]
        for q in ("p50", "p99"):
            added = [a - b for a, b in zip(h[q], z[q], strict=True)]
            print(
                f"  {q} latency (ms): HTTP {_mmm(h[q], '{:.2f}')}, ZMQ {_mmm(z[q], '{:.2f}')}, "
                f"added by HTTP {_mmm(added, '{:.2f}')}"
            )
        print(
            f"  CPU us / request: HTTP scheduler {_mmm(h['scheduler'])} + front end "
            f"{_mmm(h['front end'])}; ZMQ scheduler {_mmm(z['scheduler'])}"
        )
        print(
            "  HTTP / ZMQ server CPU per request at equal rate: "
            f"{_mmm(_ratios(h['server'], z['server']), '{:.2f}')}"
        )
        load_end = os.getloadavg()
        print(
            "machine load average (1 / 5 / 15 min): "
            f"{' / '.join(f'{v:.1f}' for v in load_start)} at the start, "
            f"{' / '.join(f'{v:.1f}' for v in load_end)} at the end"
        )
        zmq_side.socket.close()
    finally:
        stop_serve(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
