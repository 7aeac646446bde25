"""Writing a synthetic Mooncake-shaped trace: shared system prompts and follow-up turns that
repeat their conversation's blocks, as ``open_trace`` reads them back (``--format mooncake``)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

__all__ = ["write_mooncake_like"]


def write_mooncake_like(
    path: str | Path,
    num_requests: int,
    *,
    seed: int = 0,
    rate: float = 4.0,
    block_size: int = 512,
    num_prefixes: int = 32,
    prefix_blocks: tuple[int, int] = (1, 4),
    follow_up: float = 0.5,
    max_input: int = 16384,
) -> Path:
    """Write a Mooncake-shaped JSONL trace of ``num_requests`` requests to ``path``.

    Like a real Mooncake trace, new hash ids are consecutive integers and requests share them
    in two ways: a new conversation starts with one of ``num_prefixes`` shared system prompts
    (``prefix_blocks`` blocks each, popularity falling as 1/rank), and with probability
    ``follow_up`` a request continues an open conversation instead: its prompt is the previous
    prompt plus the answer plus a new message, so it repeats the previous prompt's full
    blocks. Messages (median ~300 tokens) and answers (median ~150) are log-normal; arrivals
    are Poisson at ``rate`` per second, timestamps in whole milliseconds.
    """
    rng = random.Random(seed)
    next_id = itertools.count()
    prefixes = [
        [next(next_id) for _ in range(rng.randint(*prefix_blocks))] for _ in range(num_prefixes)
    ]
    popularity = list(itertools.accumulate(1 / (rank + 1) for rank in range(num_prefixes)))
    open_conversations: list[tuple[list[int], int, int]] = []  # hash_ids, input, output
    now = 0.0
    with open(path, "w", encoding="utf-8") as out:
        for _ in range(num_requests):
            now += rng.expovariate(rate)
            message = min(4096, max(8, int(rng.lognormvariate(5.7, 0.9))))
            output = min(1024, max(4, int(rng.lognormvariate(5.0, 0.8))))
            shared: list[int] = []
            length = 0
            if open_conversations and rng.random() < follow_up:
                which = rng.randrange(len(open_conversations))
                ids, previous, answer = open_conversations[which]
                length = previous + answer + message
                if length <= max_input:
                    shared = ids[: previous // block_size]
                open_conversations[which] = open_conversations[-1]
                open_conversations.pop()
            if not shared:
                shared = rng.choices(prefixes, cum_weights=popularity)[0]
                length = len(shared) * block_size + message
            blocks = -(-length // block_size)
            ids = shared + [next(next_id) for _ in range(blocks - len(shared))]
            open_conversations.append((ids, length, output))
            if len(open_conversations) > 256:
                open_conversations.pop(rng.randrange(len(open_conversations)))
            out.write(
                f'{{"timestamp": {int(now * 1000)}, "input_length": {length}, '
                f'"output_length": {output}, "hash_ids": [{", ".join(map(str, ids))}]}}\n'
            )
    return Path(path)
