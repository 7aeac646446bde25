"""The trace formats ``open_trace`` reads: each turns a file into records (checked, cheap to
hold) and a record into a request (tokens made only then).

- ``jsonl``: schedkit's own format (``schedkit.workloads.traces`` documents it).
- ``mooncake``: JSONL of ``{"timestamp": ms, "input_length": n, "output_length": n,
  "hash_ids": [...]}``, one hash id per block of ``block_size`` (512) prompt tokens; other
  fields are ignored. Tokens as NVIDIA Dynamo's mocker makes them
  (``lib/mocker/src/loadgen/trace.rs``, ``TurnTrace::synthesize_tokens``): hash id ``h`` is
  the block ``[h mod 2**32] * block_size``, the last block cut to ``input_length``, so
  requests that share hash ids share those tokens and a router sees the same blocks as
  Dynamo's replay. The prompt is made packed (``array('I')``, 4 bytes a token, as a request
  waits at a router). ``hash_ids`` must have exactly ``ceil(input_length / block_size)`` ids
  (Dynamo clamps a longer ``input_length`` instead; here it is reported, since a wrong block
  size is the usual cause).
- ``azure``: the Azure LLM inference trace CSV, ``TIMESTAMP,ContextTokens,GeneratedTokens``,
  TIMESTAMP a date and time (``2023-11-16 18:15:46.6805900``, optionally with a UTC offset).
- ``burstgpt``: BurstGPT CSV, ``Timestamp,Model,Request tokens,Response tokens,Total tokens,
  Log Type`` (Timestamp in seconds; extra columns such as ``Session ID`` are ignored).
- ``sharegpt``: one JSON array of ``{"id", "conversations": [{"from", "value"}, ...]}``; the
  first ``human`` turn followed by a ``gpt`` turn makes a request: the prompt is that human
  text and the output length that gpt text's, in tokens of 4 characters (the usual rule of
  thumb for English with GPT tokenizers), each token id a CRC-32 of its 4 characters, so equal
  text prefixes give equal token prefixes without a tokenizer.

Azure and BurstGPT carry only token counts: prompts are random tokens from the seed (no
prefix sharing). Their rows with 0 prompt or output tokens (failed requests) and ShareGPT
conversations without a human-then-gpt pair are skipped and counted in a note.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import attrs
import msgspec

from schedkit.core.schedule_batch import Req, SamplingParams
from schedkit.workloads.json_array import iter_json_array
from schedkit.workloads.jsonl_format import jsonl_records, jsonl_requests
from schedkit.workloads.trace_io import (
    MAX_REQUEST_TOKENS,
    ProblemLog,
    decode_item,
    decode_lines,
    iter_csv_rows,
)
from schedkit.workloads.trace_tokens import (
    CHARS_PER_TOKEN,
    hash_id_prompt,
    random_prompt,
    text_tokens,
)

__all__ = ["FORMATS", "TraceFormat"]

Record = tuple[int, "float | None", Any]  # line, arrival in seconds (None: from --rate), data
MakeRequest = Callable[[int, Any], Req]


@attrs.define(frozen=True)
class TraceFormat:
    """How to read one format: ``records(path, log, block_size)`` yields checked records in
    file order, reporting bad ones to ``log``; ``requests(rng, block_size)`` makes the
    function that turns a record into a request. ``timestamped`` formats carry their own
    arrival times (taken as offsets from the first record)."""

    describe: str
    timestamped: bool
    records: Callable[[Path, ProblemLog, int], Iterator[Record]]
    requests: Callable[[random.Random, int], MakeRequest]


def _trace_params(output_tokens: int) -> SamplingParams:
    # A trace gives each request's output length: it runs to that length.
    return SamplingParams(max_new_tokens=output_tokens, ignore_eos=True, stream=True)


# --- mooncake -----------------------------------------------------------------------------


class MooncakeLine(msgspec.Struct):
    """One line of a Mooncake trace (fields not listed here are ignored)."""

    timestamp: Annotated[float, msgspec.Meta(ge=0)]
    input_length: Annotated[int, msgspec.Meta(ge=1, le=MAX_REQUEST_TOKENS)]
    output_length: Annotated[int, msgspec.Meta(ge=1, le=MAX_REQUEST_TOKENS)]
    hash_ids: list[Annotated[int, msgspec.Meta(ge=0)]]


def _mooncake_records(path: Path, log: ProblemLog, block_size: int) -> Iterator[Record]:
    for number, row in decode_lines(path, MooncakeLine, log):
        blocks = -(-row.input_length // block_size)
        if len(row.hash_ids) != blocks:
            log.add(
                number,
                f"{len(row.hash_ids)} hash_ids for input_length {row.input_length}, which "
                f"takes {blocks} blocks of {block_size} tokens (one hash id per block; is the "
                f"trace's block size {block_size}? see --trace-block-size)",
            )
            continue
        yield number, row.timestamp / 1000, row


def _mooncake_requests(rng: random.Random, block_size: int) -> MakeRequest:
    def make(number: int, row: MooncakeLine) -> Req:
        tokens = hash_id_prompt(row.hash_ids, row.input_length, block_size)
        return Req(
            rid=f"line{number}",
            origin_input_ids=tokens,
            sampling_params=_trace_params(row.output_length),
        )

    return make


# --- azure and burstgpt (CSV, token counts only) ------------------------------------------

_DATETIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(\.\d+)?\s*(Z|[+-]\d{2}:?\d{2})?"
)


def datetime_seconds(text: str) -> float | None:
    """Seconds since the epoch of ``2023-11-16 18:15:46.6805900`` (any number of fraction
    digits, an optional UTC offset; none means UTC), or None if ``text`` is not like that."""
    match = _DATETIME.fullmatch(text)
    if match is None:
        return None
    day, clock, fraction, offset = match.groups()
    offset = "+00:00" if offset in (None, "Z") else offset
    try:
        stamp = datetime.fromisoformat(f"{day}T{clock}{offset}")
    except ValueError:
        return None
    return stamp.astimezone(timezone.utc).timestamp() + float(fraction or 0)


def _counts(number: int, log: ProblemLog, named: dict[str, str]) -> tuple[int, ...] | None:
    counts = []
    for name, value in named.items():
        if not (value.isascii() and value.isdigit()):
            log.add(number, f"{name} must be a whole number >= 0, got {value[:40]!r}", kind=name)
            return None
        if len(value) > 7 and int(value) > MAX_REQUEST_TOKENS:
            log.add(
                number,
                f"{name} {value[:40]} is over the {MAX_REQUEST_TOKENS} tokens a request may have",
                kind=f"{name} bound",
            )
            return None
        counts.append(int(value))
    return tuple(counts)


def _csv_records(
    columns: tuple[str, str, str], parse_time: Callable[[str], float | None], example: str
) -> Callable[[Path, ProblemLog, int], Iterator[Record]]:
    def records(path: Path, log: ProblemLog, block_size: int) -> Iterator[Record]:
        for number, (stamp, prompt, output) in iter_csv_rows(path, columns, log):
            time = parse_time(stamp)
            if time is None:
                log.add(number, f"{columns[0]} must be {example}, got {stamp!r}", kind="time")
                continue
            counts = _counts(number, log, {columns[1]: prompt, columns[2]: output})
            if counts is None:
                continue
            if 0 in counts:
                log.skip(number, f"0 {columns[1]} or {columns[2]}")
                continue
            yield number, time, counts

    return records


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value < math.inf else None


def _counted_requests(rng: random.Random, block_size: int) -> MakeRequest:
    def make(number: int, counts: tuple[int, int]) -> Req:
        return Req(
            rid=f"line{number}",
            origin_input_ids=random_prompt(rng, counts[0]),
            sampling_params=_trace_params(counts[1]),
        )

    return make


# --- sharegpt -----------------------------------------------------------------------------


class ShareGptTurn(msgspec.Struct):
    """One turn of a ShareGPT conversation."""

    speaker: str = msgspec.field(name="from")
    value: str


class ShareGptConversation(msgspec.Struct):
    """One ShareGPT conversation (its ``id`` and other fields are not needed)."""

    conversations: list[ShareGptTurn]


def _sharegpt_records(path: Path, log: ProblemLog, block_size: int) -> Iterator[Record]:
    decoder = msgspec.json.Decoder(ShareGptConversation)
    for number, text in iter_json_array(path, log):
        conversation = decode_item(decoder, text, number, log)
        if conversation is None:
            continue
        turns = conversation.conversations
        pair = next(
            (
                (ask.value, answer.value)
                for ask, answer in itertools.pairwise(turns)
                if ask.speaker == "human" and answer.speaker == "gpt"
            ),
            None,
        )
        if pair is None or not pair[0] or not pair[1]:
            log.skip(number, "no non-empty human turn followed by a gpt turn")
            continue
        longest = max(map(len, pair))
        if longest > MAX_REQUEST_TOKENS * CHARS_PER_TOKEN:
            tokens = -(-longest // CHARS_PER_TOKEN)
            text = f"a turn of {tokens} tokens, over the {MAX_REQUEST_TOKENS} a request may have"
            log.add(number, text, kind="turn bound")
            continue
        yield number, None, pair


def _sharegpt_requests(rng: random.Random, block_size: int) -> MakeRequest:
    index = itertools.count()  # several conversations may share a line

    def make(number: int, pair: tuple[str, str]) -> Req:
        prompt, answer = pair
        return Req(
            rid=f"conversation{next(index)}",
            origin_input_ids=text_tokens(prompt),
            sampling_params=_trace_params(-(-len(answer) // CHARS_PER_TOKEN)),
        )

    return make


FORMATS: dict[str, TraceFormat] = {
    "jsonl": TraceFormat(
        "schedkit's JSONL (input_ids or prompt_len per line)",
        False,
        jsonl_records,
        jsonl_requests,
    ),
    "mooncake": TraceFormat(
        "Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids)",
        True,
        _mooncake_records,
        _mooncake_requests,
    ),
    "azure": TraceFormat(
        "Azure LLM inference CSV (TIMESTAMP,ContextTokens,GeneratedTokens)",
        True,
        _csv_records(
            ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
            datetime_seconds,
            "a date and time like 2023-11-16 18:15:46.6805900",
        ),
        _counted_requests,
    ),
    "burstgpt": TraceFormat(
        "BurstGPT CSV (Timestamp,Model,Request tokens,Response tokens,...)",
        True,
        _csv_records(("Timestamp", "Request tokens", "Response tokens"), _seconds, "seconds >= 0"),
        _counted_requests,
    ),
    "sharegpt": TraceFormat(
        "ShareGPT JSON array of conversations (arrivals from --rate)",
        False,
        _sharegpt_records,
        _sharegpt_requests,
    ),
}
