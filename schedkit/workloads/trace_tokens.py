"""The prompt tokens a trace record's request gets: random ones for formats that carry only
counts, Dynamo's mocker blocks for a Mooncake record's hash ids, and 4-character CRC-32 tokens
for ShareGPT text (equal text prefixes give equal token prefixes, without a tokenizer)."""

from __future__ import annotations

import random
import struct
import zlib
from array import array

from schedkit.workloads.workload import VOCAB

__all__ = ["CHARS_PER_TOKEN", "hash_id_prompt", "hash_id_tokens", "random_prompt", "text_tokens"]

_U32 = struct.Struct("=I").pack  # a token as array('I') holds it (native order, 4 bytes)
_U32_SIZE = array("I").itemsize
CHARS_PER_TOKEN = 4


def random_prompt(rng: random.Random, n: int) -> list[int]:
    """``n`` random token ids in ``VOCAB`` from ``rng`` (two random bytes each: fast)."""
    low, span = VOCAB[0], VOCAB[1] - VOCAB[0]
    return [t % span + low for t in array("H", rng.randbytes(2 * n))]


def hash_id_tokens(hash_ids: list[int], input_length: int, block_size: int) -> list[int]:
    """The prompt of a Mooncake record, as Dynamo's mocker makes it: ``block_size`` copies of
    each hash id (mod 2**32), cut to ``input_length``."""
    return hash_id_prompt(hash_ids, input_length, block_size).tolist()


def hash_id_prompt(hash_ids: list[int], input_length: int, block_size: int) -> array:
    """``hash_id_tokens`` packed (``array('I')``), its bytes made a block at a time."""
    raw = b"".join([_U32(hash_id & 0xFFFFFFFF) * block_size for hash_id in hash_ids])
    tokens = array("I")
    tokens.frombytes(memoryview(raw)[: _U32_SIZE * input_length])
    return tokens


def text_tokens(text: str) -> list[int]:
    """``text`` as token ids: one per 4 characters, the CRC-32 of those characters in VOCAB."""
    low, span = VOCAB[0], VOCAB[1] - VOCAB[0]
    step = CHARS_PER_TOKEN
    return [zlib.crc32(text[i : i + step].encode()) % span + low for i in range(0, len(text), step)]
