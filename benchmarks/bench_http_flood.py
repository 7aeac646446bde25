"""A small request from one API key while another key floods ``schedkit serve --http`` (the
shipped wiring: llama3-8b on h100, the wall clock, default front-end limits).

The small request is streamed (16 prompt tokens, 4 new), so that its chunks time the steps it
rides in: its latency is from sending it to ``data: [DONE]``, its first token also waits for
the step in progress when it arrives, and the step time is the gap between its chunks.
Printed, min / median / max over ``--repeat`` requests: at idle, then with the flood running
(``--flood`` requests of ``--flood-prompt`` tokens and ``--flood-new`` new tokens kept in
flight from the other key, each prompt of random token ids), its latency, first token and
step time; and the longest step the flood can run ahead of the small request, timed at idle,
for the bound "2 x idle + one step": a prefill of ``max_scheduler_waiting_tokens`` fresh
tokens (the front end's bound on the flood's prompt tokens waiting in the scheduler), or of one
flood prompt up to a chunk (``chunked_prefill_size``, 8,192) when the prompts are longer.

Usage: ``python benchmarks/bench_http_flood.py [--repeat 5] [--flood 512] [--http-limit
NAME=VALUE ...] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import time

from schedkit.http.config import Limits
from schedkit.testing.serving import start_http_serve, stop_serve

KEYS = {"flood": "flood-key", "small": "small-key"}
# The shipped wiring's chunked_prefill_size.
CHUNK = 8192


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


async def _one_step(host: str, port: int, tokens: int, seed: int) -> float:
    """The latency of a request of ``tokens`` fresh prompt tokens and one new token at idle:
    one prefill step of that many tokens, plus the front end's overhead."""
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


async def _flood(host: str, port: int, args: argparse.Namespace, stop: asyncio.Event) -> int:
    """Keep ``args.flood`` requests in flight from the flood key until ``stop``, each with a
    prompt of its own (random token ids: no prefix cache hits)."""
    done = 0

    async def one_connection(seed: int) -> None:
        nonlocal done
        rng = random.Random(seed)
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        while not stop.is_set():
            prompt = [rng.randrange(1000, 30000) for _ in range(args.flood_prompt)]
            writer.write(_request(host, port, "flood", prompt, args.flood_new, False))
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"flood request refused: {head[:200]!r}")
            done += 1
        writer.close()

    await asyncio.gather(*(one_connection(i) for i in range(args.flood)))
    return done


def _mmm(values: list[float], scale: float = 1e3) -> str:
    ordered = [v * scale for v in (min(values), statistics.median(values), max(values))]
    return " / ".join(f"{v:.1f}" for v in ordered)


async def _run(host: str, port: int, args: argparse.Namespace) -> None:
    prompts = [[300 + 17 * i + j for j in range(16)] for i in range(2 * args.repeat)]
    budget = _limits(args).get(
        "max_scheduler_waiting_tokens", Limits().max_scheduler_waiting_tokens
    )
    # A flood prompt over the budget goes alone, and is prefilled a chunk at a time.
    step_tokens = max(int(budget), min(args.flood_prompt, CHUNK))
    step = [await _one_step(host, port, step_tokens, i) for i in range(args.repeat)]
    idle, idle_first, idle_steps = [], [], []
    for prompt in prompts[: args.repeat]:
        latency, first, gaps = await _small(host, port, prompt)
        idle.append(latency)
        idle_first.append(first)
        idle_steps += gaps
    stop = asyncio.Event()
    flood = asyncio.ensure_future(_flood(host, port, args, stop))
    await asyncio.sleep(args.warmup)
    behind, first_tokens, steps = [], [], []
    for prompt in prompts[args.repeat :]:
        latency, first, gaps = await _small(host, port, prompt)
        behind.append(latency)
        first_tokens.append(first)
        steps += gaps
        await asyncio.sleep(0.2)
    stop.set()
    served = await flood
    row = "{:<52}{}"
    print(
        f"bench_http_flood: {args.repeat} small requests (16 prompt tokens, 4 new, streamed) "
        f"at idle, then behind {args.flood} requests in flight from another key "
        f"({args.flood_prompt} prompt tokens, {args.flood_new} new; {served:,} served); "
        "min / median / max"
    )
    print(row.format("small request at idle (ms)", _mmm(idle)))
    print(row.format("  its first token (ms)", _mmm(idle_first)))
    print(row.format("  step at idle: gap between its tokens (ms)", _mmm(idle_steps)))
    print(row.format("small request under the flood (ms)", _mmm(behind)))
    print(row.format("  its first token (ms)", _mmm(first_tokens)))
    print(row.format("  step under the flood: gap between its tokens (ms)", _mmm(steps)))
    print(
        row.format(
            f"one step: a {step_tokens:,}-token prefill at idle (ms)",
            _mmm(step),
        )
    )
    median_idle = statistics.median(idle)
    print(row.format("  bound 2 x idle, medians (ms)", f"{2e3 * median_idle:.1f}"))
    print(
        row.format(
            "  bound 2 x idle + one step, medians (ms)",
            f"{1e3 * (2 * median_idle + statistics.median(step)):.1f}",
        )
    )


def _limits(args: argparse.Namespace) -> dict[str, str]:
    return dict(limit.split("=", 1) for limit in args.http_limit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--flood", type=int, default=512, help="flood requests kept in flight")
    parser.add_argument("--flood-prompt", type=int, default=256)
    parser.add_argument("--flood-new", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of flood first")
    parser.add_argument(
        "--http-limit", action="append", default=[], metavar="NAME=VALUE", help="a front-end limit"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 repeats, a flood of 16, 0.3 s first"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.flood, args.warmup = 2, 16, 0.3
    options = ["--api-key", KEYS["flood"], "--api-key", KEYS["small"]]
    for limit in args.http_limit:
        options += ["--http-limit", limit]
    server, url, _ = start_http_serve(*options)
    try:
        host, port = url.removeprefix("http://").split(":")
        asyncio.run(_run(host, int(port), args))
    finally:
        stop_serve(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
