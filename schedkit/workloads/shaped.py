"""Synthetic traces shaped like the public ones, written in their own formats (no real trace
is shipped): ``write_mooncake_shaped`` (Mooncake FAST'25 conversation traces) and
``write_azure_shaped`` (Azure LLM inference 2023 conversation trace, no prefix sharing).

Mooncake-shaped, as the published traces are: every prompt starts with the same hot first
block (hash id 0, a system prompt every request shares); arrivals come in bursts every
``burst_seconds`` (3 s) with one timestamp per burst; prompt lengths are log-normal with mean
~12k and p99 ~85k tokens (``input_mean``/``input_p99``), outputs log-normal with mean ~340;
a request continues, with probability ``follow_up``, the longest open conversation shorter
than its length (its prompt repeats that conversation's blocks, then new ones), which puts
about 37% of block references on a block seen before (``repeated_block_share`` measures it).
"""

from __future__ import annotations

import itertools
import math
import random
from datetime import datetime, timedelta
from pathlib import Path

__all__ = [
    "lognormal_params",
    "repeated_block_share",
    "write_azure_shaped",
    "write_mooncake_shaped",
]

_Z99 = 2.3263478740408408  # the standard normal's 99th percentile


def lognormal_params(mean: float, p99: float) -> tuple[float, float]:
    """(mu, sigma) of the log-normal with this mean and 99th percentile."""
    ratio = math.log(p99 / mean)
    disc = _Z99 * _Z99 - 2 * ratio
    if disc < 0:
        raise ValueError(f"no log-normal has mean {mean} and p99 {p99}")
    sigma = _Z99 - math.sqrt(disc)
    return math.log(mean) - sigma * sigma / 2, sigma


def write_mooncake_shaped(
    path: str | Path,
    num_requests: int,
    *,
    seed: int = 0,
    rate: float = 1.0,
    burst_seconds: float = 3.0,
    block_size: int = 512,
    input_mean: float = 12_000,
    input_p99: float = 85_000,
    output_mean: float = 340,
    max_input: int = 131_072,
    follow_up: float = 0.37,
) -> Path:
    """Write a Mooncake-shaped trace (see the module docstring); token figures are at
    ``block_size`` 512 and scale with it (a smaller block gives the same shape, shorter)."""
    rng = random.Random(seed)
    scale = block_size / 512
    mu, sigma = lognormal_params(input_mean * scale, input_p99 * scale)
    out_mu = math.log(output_mean) - 0.5
    next_id = itertools.count(1)
    conversations: list[list[int]] = []
    t, left_in_burst = 0.0, 0
    with open(path, "w", encoding="utf-8") as out:
        for _ in range(num_requests):
            while left_in_burst == 0:
                t += burst_seconds
                left_in_burst = _poisson(rng, rate * burst_seconds)
            left_in_burst -= 1
            length = max(1, min(int(max_input * scale), int(rng.lognormvariate(mu, sigma))))
            blocks = -(-length // block_size)
            ids = [0]
            if conversations and rng.random() < follow_up:
                # the longest open conversation that this prompt can continue
                fits = [i for i, c in enumerate(conversations) if len(c) < blocks]
                if fits:
                    which = max(fits, key=lambda i: len(conversations[i]))
                    ids = list(conversations[which])
                    conversations[which] = conversations[-1]
                    conversations.pop()
            ids += [next(next_id) for _ in range(blocks - len(ids))]
            conversations.append(ids)
            if len(conversations) > 512:
                conversations.pop(rng.randrange(len(conversations)))
            output = max(1, min(4096, int(rng.lognormvariate(out_mu, 1.0))))
            out.write(
                f'{{"timestamp": {int(t * 1000)}, "input_length": {length}, '
                f'"output_length": {output}, "hash_ids": [{", ".join(map(str, ids))}]}}\n'
            )
    return Path(path)


def write_azure_shaped(
    path: str | Path,
    num_requests: int,
    *,
    seed: int = 0,
    rate: float = 4.0,
    input_mean: float = 1_155,
    input_p99: float = 8_000,
    output_mean: float = 211,
    scale: float = 1.0,
) -> Path:
    """Write an Azure-shaped CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``): Poisson
    arrivals at ``rate`` per second, log-normal prompt and output lengths with the
    conversation trace's means (``scale`` multiplies the token counts). The format carries no
    tokens, so its prompts share nothing."""
    rng = random.Random(seed)
    mu, sigma = lognormal_params(input_mean * scale, input_p99 * scale)
    out_mu = math.log(max(2.0, output_mean * scale)) - 0.5
    start = datetime(2023, 11, 16, 18, 0, 0)
    t = 0.0
    with open(path, "w", encoding="utf-8") as out:
        out.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for _ in range(num_requests):
            t += rng.expovariate(rate)
            prompt = max(1, int(rng.lognormvariate(mu, sigma)))
            output = max(1, min(4096, int(rng.lognormvariate(out_mu, 1.0))))
            stamp = (start + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f")
            out.write(f"{stamp}0,{prompt},{output}\n")
    return Path(path)


def repeated_block_share(hash_ids: list[list[int]]) -> float:
    """The share of block references (hash ids, over every request) to a block an earlier
    request or an earlier block of the same request already named."""
    seen: set[int] = set()
    total = repeated = 0
    for ids in hash_ids:
        for h in ids:
            total += 1
            if h in seen:
                repeated += 1
            else:
                seen.add(h)
    return repeated / total if total else 0.0


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth's method; ``mean`` is small here)."""
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
