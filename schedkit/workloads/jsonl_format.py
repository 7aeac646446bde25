"""schedkit's own JSONL workload format as a trace format (documented in
``schedkit.workloads.traces``): lines are checked as records, and random prompt tokens are made
from the seed only when a request is made."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from schedkit.core.schedule_batch import MAX_TOKEN_ID, Req, SamplingParams
from schedkit.workloads.trace_io import (
    MAX_REQUEST_TOKENS,
    MAX_TRACE_SECONDS,
    ProblemLog,
    decode_lines,
)
from schedkit.workloads.workload import random_tokens

__all__ = ["JsonlLine", "jsonl_records", "jsonl_requests"]


class JsonlLine(msgspec.Struct, forbid_unknown_fields=True):
    """One line of a schedkit JSONL workload."""

    input_ids: list[int] | None = None
    prompt_len: int | None = None
    prefix_group: str | None = None
    prefix_len: int = 0
    max_new_tokens: int = 128
    arrival: float | None = None
    rid: str | None = None
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    stream: bool = True
    stream_interval: int | None = None
    priority: int | None = None
    cache_salt: str | None = None
    extra_key: str | None = None
    routing_key: str | None = None


def _jsonl_problem(line: JsonlLine) -> str | None:
    if (line.input_ids is None) == (line.prompt_len is None):
        return "give exactly one of 'input_ids' or 'prompt_len'"
    prompt = line.prompt_len if line.input_ids is None else len(line.input_ids)
    for name, count in (("the prompt", prompt), ("'max_new_tokens'", line.max_new_tokens)):
        if count > MAX_REQUEST_TOKENS:
            return f"{name} has {count} tokens, over the {MAX_REQUEST_TOKENS} a request may have"
    if line.input_ids is not None and not (
        line.input_ids and min(line.input_ids) >= 0 and max(line.input_ids) <= MAX_TOKEN_ID
    ):
        return f"'input_ids' must be a non-empty list of token ids in [0, {MAX_TOKEN_ID}]"
    if line.prompt_len is not None and line.prompt_len < 1:
        return "'prompt_len' must be >= 1"
    if line.prompt_len is not None and not 0 <= line.prefix_len <= line.prompt_len:
        return "'prefix_len' must be between 0 and 'prompt_len'"
    if line.arrival is not None and not 0 <= line.arrival <= MAX_TRACE_SECONDS:
        return f"'arrival' must be a number of seconds in [0, {MAX_TRACE_SECONDS:g}]"
    return _jsonl_params(line).validation_error()


def _jsonl_params(line: JsonlLine) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=line.max_new_tokens,
        stop_token_ids=tuple(line.stop_token_ids),
        ignore_eos=line.ignore_eos,
        stream=line.stream,
        stream_interval=line.stream_interval,
    )


def jsonl_records(
    path: Path, log: ProblemLog, block_size: int
) -> Iterator[tuple[int, float | None, JsonlLine]]:
    """Each good line with its arrival (None: from the rate); bad ones go to ``log``."""
    rids: set[str] = set()
    for number, line in decode_lines(path, JsonlLine, log):
        problem = _jsonl_problem(line)
        if problem:
            log.add(number, problem)
            continue
        rid = _rid(number, line)
        if rid in rids:
            given = "" if line.rid is not None else " (a line without 'rid' takes line<N>)"
            log.add(
                number,
                f"rid {rid!r}{given} is used by an earlier line; rids must be unique",
                kind="rid",
            )
            continue
        rids.add(rid)
        yield number, line.arrival, line


def _rid(number: int, line: JsonlLine) -> str:
    return line.rid if line.rid is not None else f"line{number}"


def jsonl_requests(rng: random.Random, block_size: int) -> Callable[[int, JsonlLine], Req]:
    """Turns a line into its request; prompt_len tokens are drawn from ``rng``."""
    prefixes: dict[str, list[int]] = {}

    def make(number: int, line: JsonlLine) -> Req:
        if line.input_ids is not None:
            prompt = line.input_ids
        else:
            prefix: list[int] = []
            if line.prefix_group is not None:
                known = prefixes.setdefault(line.prefix_group, [])
                known += random_tokens(rng, max(0, line.prefix_len - len(known)))
                prefix = known[: line.prefix_len]
            prompt = prefix + random_tokens(rng, line.prompt_len - len(prefix))
        return Req(
            rid=_rid(number, line),
            origin_input_ids=prompt,
            sampling_params=_jsonl_params(line),
            priority=line.priority,
            cache_salt=line.cache_salt,
            extra_key=line.extra_key,
            routing_key=line.routing_key,
        )

    return make
