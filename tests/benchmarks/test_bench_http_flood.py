"""The flood benchmark runs end to end in its smoke mode and prints every figure and bound.

About 7 s: it starts a real ``schedkit serve --http`` on the wall clock and times requests on
it, which is what the benchmark is."""

import argparse
import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_http_flood.py"
MMM = r"[\d.]+ / [\d.]+ / [\d.]+"


def test_quick_run_prints_idle_flood_and_bounds():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for label in (
        "small request at idle",
        "step under the flood: gap between its tokens",
        r"one step: a [\d,]+-token prefill at idle",
        r"a [\d,]+-token prompt's prefill at idle",
    ):
        assert re.search(rf"^ *{label} \(ms\) +{MMM}$", out, re.MULTILINE), out
    under = (
        rf"^small request under the flood \(ms\) +{MMM} +bound 2 x idle [\d.]+: max (within|OVER)$"
    )
    assert re.search(under, out, re.MULTILINE), out
    assert re.search(
        r"^flood \([\d.]+ s\): [\d.]+ requests/s, [\d,]+ prompt tokens/s", out, re.M
    ), out


def test_the_flood_is_built_and_sent_by_a_process_of_its_own():
    """The timing process pays none of the flood's CPU: building a 32,000-token prompt takes
    ~16 ms, which on the timer's event loop would delay reading the small request's chunks."""
    from benchmarks import bench_http_flood as bench

    args = argparse.Namespace(flood=2, prompt_range=(32_000, 32_000), flood_new=1)
    start = time.process_time()
    bench._request("127.0.0.1", 1, "flood", list(range(1000, 33_000)), 1, False)
    build = time.process_time() - start

    async def run() -> tuple[bench.FloodCount, float, float, int]:
        answered = 0
        enough = asyncio.Event()

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal answered
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                answered += 1
                if answered >= 6:
                    enough.set()

        server = await asyncio.start_server(answer, "127.0.0.1", 0, limit=1 << 20)
        port = server.sockets[0].getsockname()[1]
        flood = bench.FloodProcess("127.0.0.1", port, args)
        await flood.start()
        cpu = time.process_time()
        await asyncio.wait_for(enough.wait(), 60)
        count, seconds = await flood.stop()
        cpu = time.process_time() - cpu
        server.close()
        return count, seconds, cpu, answered

    count, seconds, cpu, answered = asyncio.run(run())
    assert count.requests == answered >= 6 and seconds > 0
    assert (count.prompt_tokens, count.new_tokens) == (32_000 * answered, answered)
    assert cpu < 0.5 * build * answered, (cpu, build, answered)
