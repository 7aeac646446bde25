"""A small request from one API key while another key floods ``schedkit serve --http`` (the
shipped wiring: llama3-8b on h100, the wall clock, default front-end limits).

The small request is streamed (16 prompt tokens, 4 new), so that its chunks time the steps it
rides in: its latency is from sending it to ``data: [DONE]``, its first token also waits for
the step in progress when it arrives, and the step time is the gap between its chunks.
Printed, min / median / max over ``--repeat`` requests: at idle, then with the flood running
(``--flood`` requests of ``--flood-prompt`` tokens and ``--flood-new`` new tokens kept in
flight from the other key, each prompt of random token ids), its latency, first token and
step time, beside the target "2 x idle" (twice the median at idle; every request under the
flood should be within it); the flood's own throughput;
and, at idle, one prefill step at the start of a prompt as the server bounds it
(``--http-prefill-step``, auto: the fresh tokens costing at most two idle decode steps) and the
prefill of one whole flood prompt (of the longest size).

``--long``: a flood of long prompts instead, 16 in flight of 8,192 to 32,000 tokens each
(uniformly drawn), 16 new (the front end forwards a prompt over its scheduler-waiting budget
only once the scheduler's queue is empty, so more in flight would only lengthen the drain).
The flood's throughput counts the requests it completed from its start until it drained.

Usage: ``python benchmarks/bench_http_flood.py [--repeat 5] [--flood 512] [--long]
[--http-prefill-step auto|off|MS] [--against-off] [--rounds N] [--http-limit NAME=VALUE ...]
[--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import multiprocessing.queues
import multiprocessing.synchronize
import random
import statistics
import time

import attrs

import schedkit
from schedkit import wirings
from schedkit.assembly.wiring import Wiring
from schedkit.cli.http_step_bound import cost_model, parse_prefill_step, prefill_step_overlay
from schedkit.components.scheduler.prefill_step_bound import PrefillStepBound
from schedkit.components.scheduler.scheduler import Scheduler
from schedkit.http.launcher import HttpServer
from schedkit.testing.serving import start_http_serve, stop_serve

KEYS = {"flood": "flood-key", "small": "small-key"}
LONG = (8192, 32000)


def _request(host: str, port: int, key: str, prompt: list[int], new: int, stream: bool) -> bytes:
    body = json.dumps(
        {"prompt": prompt, "max_tokens": new, "stream": stream, "ignore_eos": True}
    ).encode()
    return (
        f"POST /v1/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"authorization: Bearer {KEYS[key]}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _small(host: str, port: int, prompt: list[int]) -> tuple[float, float, list[float]]:
    """One streamed small request on a new connection: its latency, its first token's and
    its chunks' gaps."""
    reader, writer = await asyncio.open_connection(host, port)
    start = time.perf_counter()
    writer.write(_request(host, port, "small", prompt, 4, True))
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"small request refused: {head[:200]!r}")
    arrivals = []
    while True:
        line = await reader.readuntil(b"\n\n")
        arrivals.append(time.perf_counter())
        if b"data: [DONE]" in line:
            break
    latency = arrivals[-1] - start
    writer.close()
    return latency, arrivals[0] - start, [b - a for a, b in itertools.pairwise(arrivals[:-1])]


async def _prefill(host: str, port: int, tokens: int, seed: int) -> float:
    """The latency of a request of ``tokens`` fresh prompt tokens and one new token at idle:
    its prefill steps, plus the front end's overhead."""
    rng = random.Random(seed)
    prompt = [rng.randrange(1000, 30000) for _ in range(tokens)]
    reader, writer = await asyncio.open_connection(host, port)
    start = time.perf_counter()
    writer.write(_request(host, port, "small", prompt, 1, False))
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    writer.close()
    return time.perf_counter() - start


class FloodCount:
    """The flood's requests sent, and those completed with their prompt and new tokens."""

    def __init__(self) -> None:
        self.sent = self.requests = self.prompt_tokens = self.new_tokens = 0


class FloodProcess:
    """The flood's client in a process of its own, as another key's client is: building and
    sending a long prompt (~16 ms of CPU for 32,000 random token ids) would otherwise stall
    the event loop that timestamps the small request's chunks, and count as server latency."""

    def __init__(self, host: str, port: int, args: argparse.Namespace) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop, self._ready = context.Event(), context.Event()
        self._results = context.SimpleQueue()
        self._process = context.Process(
            target=_flood_process,
            args=(host, port, args, self._stop, self._ready, self._results),
            daemon=True,
        )

    async def start(self, timeout: float = 60.0) -> None:
        """Start the flood's process and wait until it has sent its first requests."""
        self._process.start()
        if not await asyncio.to_thread(self._ready.wait, timeout):
            self._process.kill()
            raise RuntimeError(f"the flood's client did not start within {timeout} s")

    async def stop(self) -> tuple[FloodCount, float]:
        """Stop sending, wait for the requests in flight; what completed and the seconds from
        the flood's start until it drained."""
        self._stop.set()
        result = await asyncio.to_thread(self._results.get)
        await asyncio.to_thread(self._process.join)
        if isinstance(result, str):
            raise RuntimeError(f"the flood's client failed: {result}")
        requests, prompt_tokens, new_tokens, seconds = result
        count = FloodCount()
        count.requests, count.prompt_tokens, count.new_tokens = requests, prompt_tokens, new_tokens
        return count, seconds


def _flood_process(
    host: str,
    port: int,
    args: argparse.Namespace,
    stop: multiprocessing.synchronize.Event,
    ready: multiprocessing.synchronize.Event,
    results: multiprocessing.queues.SimpleQueue,
) -> None:
    """``FloodProcess``'s body: ``_flood`` on an event loop of its own until ``stop`` is set."""

    async def run() -> tuple[int, int, int, float]:
        done, count = asyncio.Event(), FloodCount()
        start = time.perf_counter()
        flood = asyncio.ensure_future(_flood(host, port, args, done, count))
        while count.sent < args.flood and not flood.done():  # each connection's first request
            await asyncio.sleep(0.01)
        ready.set()
        while not stop.is_set() and not flood.done():
            await asyncio.sleep(0.01)
        done.set()
        await flood
        return count.requests, count.prompt_tokens, count.new_tokens, time.perf_counter() - start

    try:
        results.put(asyncio.run(run()))
    except Exception as exc:  # reported to the parent, which raises it
        results.put(f"{type(exc).__name__}: {exc}")


async def _flood(
    host: str, port: int, args: argparse.Namespace, stop: asyncio.Event, count: FloodCount
) -> None:
    """Keep ``args.flood`` requests in flight from the flood key until ``stop``, each with a
    prompt of its own (random token ids: no prefix cache hits), counting what completes."""
    low, high = args.prompt_range

    async def one_connection(seed: int) -> None:
        rng = random.Random(seed)
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        while not stop.is_set():
            tokens = rng.randint(low, high)
            prompt = [rng.randrange(1000, 30000) for _ in range(tokens)]
            writer.write(_request(host, port, "flood", prompt, args.flood_new, False))
            count.sent += 1
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"flood request refused: {head[:200]!r}")
            count.requests += 1
            count.prompt_tokens += tokens
            count.new_tokens += args.flood_new
        writer.close()

    await asyncio.gather(*(one_connection(i) for i in range(args.flood)))


def _mmm(values: list[float], scale: float = 1e3) -> str:
    ordered = [v * scale for v in (min(values), statistics.median(values), max(values))]
    return " / ".join(f"{v:.1f}" for v in ordered)


async def _run(host: str, port: int, args: argparse.Namespace, chunk: int, step_bound: str) -> None:
    prompts = [[300 + 17 * i + j for j in range(16)] for i in range(2 * args.repeat)]
    low, high = args.prompt_range
    step = [await _prefill(host, port, chunk, i) for i in range(args.repeat)]
    whole = [await _prefill(host, port, high, 100 + i) for i in range(args.repeat)]
    idle, idle_first, idle_steps = [], [], []
    for prompt in prompts[: args.repeat]:
        latency, first, gaps = await _small(host, port, prompt)
        idle.append(latency)
        idle_first.append(first)
        idle_steps += gaps
    flood = FloodProcess(host, port, args)
    await flood.start()
    await asyncio.sleep(args.warmup)
    behind, first_tokens, steps = [], [], []
    for prompt in prompts[args.repeat :]:
        latency, first, gaps = await _small(host, port, prompt)
        behind.append(latency)
        first_tokens.append(first)
        steps += gaps
        await asyncio.sleep(0.2)
    count, seconds = await flood.stop()
    size = f"{low}" if low == high else f"{low}-{high}"
    bound = 2 * statistics.median(idle)

    def row(label: str, figures: str, note: str = "") -> str:
        return f"{label:<52}{figures:<24}{note}".rstrip()

    print(
        f"bench_http_flood: {args.repeat} small requests (16 prompt tokens, 4 new, streamed) "
        f"at idle, then behind {args.flood} requests in flight from another key "
        f"({size} prompt tokens, {args.flood_new} new); {step_bound}; "
        "min / median / max"
    )
    print(row("small request at idle (ms)", _mmm(idle)))
    print(row("  its first token (ms)", _mmm(idle_first)))
    print(row("  step at idle: gap between its tokens (ms)", _mmm(idle_steps)))
    within = "within" if max(behind) <= bound else "OVER"
    print(
        row(
            "small request under the flood (ms)",
            _mmm(behind),
            f"bound 2 x idle {1e3 * bound:.1f}: max {within}",
        )
    )
    print(row("  its first token (ms)", _mmm(first_tokens)))
    print(row("  step under the flood: gap between its tokens (ms)", _mmm(steps)))
    print(row(f"one step: a {chunk:,}-token prefill at idle (ms)", _mmm(step)))
    print(row(f"a {high:,}-token prompt's prefill at idle (ms)", _mmm(whole)))
    print(
        f"flood ({seconds:.1f} s): {count.requests / seconds:.1f} requests/s, "
        f"{count.prompt_tokens / seconds:,.0f} prompt tokens/s, "
        f"{count.new_tokens / seconds:,.0f} new tokens/s"
    )


def _first_step(args: argparse.Namespace) -> tuple[int, str]:
    """The fresh tokens of a prefill step at the start of a prompt as ``schedkit serve --http``
    bounds it for ``args``, and the bound in words."""
    wiring: Wiring = schedkit.load_wiring(wirings.path())
    chunk = wiring.components["scheduler"].args.get(
        "chunked_prefill_size", attrs.fields(Scheduler).chunked_prefill_size.default
    )
    overlay, _ = prefill_step_overlay(
        args.http_prefill_step, wiring, attrs.fields(HttpServer).context_length.default
    )
    if overlay is None:
        return chunk, f"prefill steps of at most {chunk} tokens"
    seconds = overlay["components"]["scheduler"]["args"]["max_prefill_step_seconds"]
    runner = cost_model(wiring.components["model_runner"].args)
    page = wiring.components["allocator"].args["page_size"]
    bound = PrefillStepBound(
        max_seconds=seconds,
        prefill_seconds=runner.prefill_seconds,
        page_size=page,
        max_tokens=chunk,
    )
    return bound.tokens_at(0), f"prefill steps of at most {seconds * 1e3:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--flood", type=int, default=512, help="flood requests kept in flight")
    parser.add_argument("--flood-prompt", type=int, default=256)
    parser.add_argument("--flood-new", type=int, default=64)
    parser.add_argument(
        "--long",
        action="store_true",
        help=f"a flood of long prompts: 16 in flight of {LONG[0]:,}-{LONG[1]:,} tokens, 16 new",
    )
    parser.add_argument(
        "--http-prefill-step",
        type=parse_prefill_step,
        default="auto",
        help="the server's prefill step bound: auto (the default), off or milliseconds",
    )
    parser.add_argument(
        "--against-off",
        action="store_true",
        help="after each run, the same with --http-prefill-step off (token bounds only)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs (of each setting)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of flood first")
    parser.add_argument(
        "--http-limit", action="append", default=[], metavar="NAME=VALUE", help="a front-end limit"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 repeats, a flood of 16, 0.3 s first"
    )
    args = parser.parse_args(argv)
    args.prompt_range = (args.flood_prompt, args.flood_prompt)
    if args.long:
        args.flood, args.flood_new, args.prompt_range = 16, 16, LONG
    if args.quick:
        args.repeat, args.flood, args.warmup = 2, 16 if not args.long else 4, 0.3
    settings = [args.http_prefill_step] + (["off"] if args.against_off else [])
    for _ in range(args.rounds):
        for setting in settings:
            _serve_and_run(args, setting)
    return 0


def _serve_and_run(args: argparse.Namespace, setting: str | int) -> None:
    args.http_prefill_step = setting
    chunk, bound = _first_step(args)
    options = ["--api-key", KEYS["flood"], "--api-key", KEYS["small"]]
    options += ["--http-prefill-step", str(setting if isinstance(setting, str) else setting * 1e3)]
    for limit in args.http_limit:
        options += ["--http-limit", limit]
    server, url, _ = start_http_serve(*options)
    try:
        host, port = url.removeprefix("http://").split(":")
        asyncio.run(_run(host, int(port), args, chunk, bound))
    finally:
        stop_serve(server)


if __name__ == "__main__":
    raise SystemExit(main())
