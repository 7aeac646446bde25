"""The host-memory tier on the Mooncake sample: hit rate and TTFT with and without it.

Method: ``schedkit run wiring.yaml --workload examples/traces/mooncake_sample.jsonl --format
mooncake --json``, one subprocess per row, with the device KV pool cut to ``--device-tokens``
(default 32768, about a tenth of the trace's 316,928-token working set: 619 distinct 512-token
blocks). The first row keeps the plain radix cache; the others overlay ``examples/hicache.yaml``
(write-through, a load-back charged at 50 GB/s for 128 KiB of KV per token) with a host pool of
``hicache_ratio`` times the device pool. The simulated model runs on its virtual clock, so every
figure is simulated time and a run is deterministic (no machine noise to pair or repeat over).

Usage: ``python benchmarks/hicache_mooncake.py [--device-tokens N] [--ratios 2 4 8]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "examples" / "traces" / "mooncake_sample.jsonl"


def run(overlays: list[Path]) -> dict:
    """One ``schedkit run`` of the Mooncake sample with ``overlays``; its JSON summary."""
    cmd = [sys.executable, "-m", "schedkit.cli", "run", str(ROOT / "wiring.yaml")]
    for overlay in overlays:
        cmd += ["-o", str(overlay)]
    cmd += ["--workload", str(TRACE), "--format", "mooncake", "--json", "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"schedkit run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def percent(rate: float | None) -> str:
    """A rate as a percentage; "n/a" for a figure the run has none of (null in its JSON)."""
    return "n/a" if rate is None else f"{rate:.1%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-tokens", type=int, default=32768)
    parser.add_argument("--ratios", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "small_pool.yaml"
        small.write_text(
            f"components:\n  allocator:\n    args:\n      size: {args.device_tokens}\n"
        )
        rows = [("radix_cache (no host tier)", run([small]))]
        for ratio in args.ratios:
            host = Path(tmp) / f"host_{ratio}.yaml"
            host.write_text(
                f"components:\n  tree_cache:\n    args:\n      hicache_ratio: {ratio}\n"
            )
            host_tokens = int(args.device_tokens * ratio)
            label = f"hiradix_cache, host {host_tokens} tokens"
            rows.append((label, run([small, ROOT / "examples" / "hicache.yaml", host])))
    print(
        f"Mooncake sample (300 requests, working set 316928 tokens), "
        f"device pool {args.device_tokens} tokens"
    )
    header = ["cache", "hit rate", "device", "host", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for label, s in rows:
        cells = [
            label,
            f"{s['prefix_cache_hit_rate']:.1%}",
            percent(s["prefix_cache_hit_rate_device"]),
            percent(s["prefix_cache_hit_rate_host"]),
            *(f"{s[f'ttft_p{q}_s'] * 1000:.1f}" for q in (50, 90, 99)),
        ]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
