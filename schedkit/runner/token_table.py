"""The simulated model runner's tokens: a seeded table every request reads from its own offset.

A table of ``TOKEN_TABLE_SIZE`` pseudo-random tokens is built from the seed; request ``rid``
reads it from an offset derived from ``(seed, rid)``, so the token at output position ``p``
depends on ``(seed, rid, p)`` only and does not change when a request is retracted and
recomputed. A fraction ``eos_probability`` of the table's entries (chosen by the seed) is
``eos_token_id``; no other entry is. Token ids are drawn from ``[0, vocab_size)``.
"""

from __future__ import annotations

import functools
import hashlib
import random

__all__ = ["TABLE_MASK", "TOKEN_TABLE_SIZE", "request_offset", "token_table"]

TOKEN_TABLE_SIZE = 1 << 16
# ``position & TABLE_MASK`` wraps a position around the table.
TABLE_MASK = TOKEN_TABLE_SIZE - 1


def request_offset(seed: int, rid: str) -> int:
    """Where request ``rid`` starts reading the token table."""
    digest = hashlib.blake2b(f"{seed}:{rid}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


@functools.lru_cache(maxsize=16)
def token_table(
    seed: int, vocab_size: int, eos_token_id: int | None, eos_probability: float
) -> list[int]:
    """The token table of runners built with these arguments (shared: nothing writes it)."""
    rng = random.Random(seed)
    table = rng.choices(range(vocab_size), k=TOKEN_TABLE_SIZE)
    if eos_token_id is not None:
        table = [(t + 1) % vocab_size if t == eos_token_id else t for t in table]
        num_eos = round(eos_probability * TOKEN_TABLE_SIZE)
        for i in rng.sample(range(TOKEN_TABLE_SIZE), num_eos):
            table[i] = eos_token_id
    return table
