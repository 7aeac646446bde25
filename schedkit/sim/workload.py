"""Workloads for ``schedkit run``: built-in synthetic traffic and JSONL files.

A workload hands the driver its first arrivals and, when a request finishes, may return a
follow-up (a multi-turn chat's next turn, whose prompt is the whole conversation so far).

JSONL format, one request per line (blank lines and lines starting with ``#`` are skipped)::

    {"input_ids": [1, 2, 3], "max_new_tokens": 64}
    {"prompt_len": 512, "prefix_group": "sys-a", "prefix_len": 384, "max_new_tokens": 128,
     "arrival": 0.25, "rid": "r-7", "stop_token_ids": [2], "ignore_eos": false,
     "stream": true, "stream_interval": 4}

Give either ``input_ids`` or ``prompt_len`` (random tokens from the seed; lines with the same
``prefix_group`` share their first ``prefix_len`` tokens). ``arrival`` (seconds) is optional:
lines without it arrive as a Poisson process at ``--rate``, or all at once without a rate.

(Just over 300 lines: the synthetic generators and the JSONL reader share the token and
arrival-clock helpers.)
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

import attrs
import msgspec

from schedkit.components.schedule_batch import Req, SamplingParams

__all__ = [
    "CHAT_RATE",
    "SYNTHETIC",
    "Arrival",
    "ChatWorkload",
    "GeneratedWorkload",
    "StaticWorkload",
    "Workload",
    "WorkloadError",
    "load_jsonl",
    "shared_prefix_workload",
    "synthetic",
]

VOCAB = (10, 32000)


class WorkloadError(Exception):
    """A workload file has bad lines; ``errors`` lists each as ``FILE:LINE: problem``."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


@attrs.define(slots=True)
class Arrival:
    """A request and the time (seconds from the start) it arrives."""

    time: float
    req: Req


class Workload(Protocol):
    """What the run driver needs from a workload: the first arrivals in time order (pulled
    one by one as the clock reaches them, so a generator keeps memory flat), and follow-ups."""

    def initial(self) -> Iterable[Arrival]: ...

    def follow_up(self, req: Req, now: float) -> Arrival | None: ...


def _arrival_times(rate: float | None, rng: random.Random) -> Iterator[float]:
    """Poisson arrival times at ``rate`` per second (all at 0 without a rate or with inf)."""
    t = 0.0
    while True:
        if rate and rate != float("inf"):
            t += rng.expovariate(rate)
        yield t


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(n)]


@attrs.define
class StaticWorkload:
    """A fixed list of arrivals with no follow-ups."""

    arrivals: list[Arrival]

    def initial(self) -> list[Arrival]:
        return self.arrivals

    def follow_up(self, req: Req, now: float) -> Arrival | None:
        return None


@attrs.define
class GeneratedWorkload:
    """Arrivals made by a generator function as they are pulled; no follow-ups."""

    make: Callable[[], Iterator[Arrival]]

    def initial(self) -> Iterator[Arrival]:
        return self.make()

    def follow_up(self, req: Req, now: float) -> Arrival | None:
        return None


@attrs.define
class ChatWorkload:
    """Multi-turn chats over shared system prompts.

    Conversations start as a Poisson process at ``rate`` per second (all at once without a
    rate, or with ``inf``); each
    has 1 to ``max_turns`` turns. A follow-up turn arrives ``think_time`` seconds after the
    previous answer finishes and its prompt is the conversation so far (system prompt, earlier
    user turns and answers, new user turn), so the prefix cache serves most of it.
    """

    num_requests: int
    rate: float | None = None
    seed: int = 0
    num_system_prompts: int = 32
    system_prompt_len: tuple[int, int] = (500, 2000)
    user_len: tuple[int, int] = (20, 200)
    output_len: tuple[int, int] = (16, 256)
    max_turns: int = 4
    think_time: float = 1.0
    _rng: random.Random = attrs.field(init=False)
    _remaining_turns: dict[str, int] = attrs.field(init=False, factory=dict)
    _issued: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def _request(self, rid: str, prompt: list[int], time: float) -> Arrival:
        params = SamplingParams(max_new_tokens=self._rng.randint(*self.output_len), stream=True)
        self._issued += 1
        return Arrival(time, Req(rid=rid, origin_input_ids=prompt, sampling_params=params))

    def initial(self) -> Iterator[Arrival]:
        """The conversations' first turns, generated as they are pulled."""
        rng = self._rng
        systems = [
            _tokens(rng, rng.randint(*self.system_prompt_len))
            for _ in range(self.num_system_prompts)
        ]
        times = _arrival_times(self.rate, rng)
        left = self.num_requests
        for i in itertools.count():
            if left <= 0:
                return
            n = min(left, rng.randint(1, self.max_turns))
            left -= n
            prompt = rng.choice(systems) + _tokens(rng, rng.randint(*self.user_len))
            self._remaining_turns[f"c{i}"] = n - 1
            yield self._request(f"c{i}-t0", prompt, next(times))

    def follow_up(self, req: Req, now: float) -> Arrival | None:
        conversation, _, turn = req.rid.rpartition("-t")
        left = self._remaining_turns.pop(conversation, 0)
        if left <= 0 or req.output_ids == []:
            return None
        self._remaining_turns[conversation] = left - 1
        prompt = (
            req.origin_input_ids
            + req.output_ids
            + _tokens(self._rng, self._rng.randint(*self.user_len))
        )
        return self._request(f"{conversation}-t{int(turn) + 1}", prompt, now + self.think_time)


def shared_prefix_workload(
    num_requests: int = 2000,
    prompt_len: int = 512,
    prefix_len: int = 384,
    groups: int = 20,
    output_len: int = 128,
    rate: float | None = None,
    seed: int = 0,
    stream: bool = False,
) -> GeneratedWorkload:
    """Prompts in ``groups`` that share a ``prefix_len``-token prefix (the benchmark's W1)."""

    def arrivals() -> Iterator[Arrival]:
        rng = random.Random(seed)
        prefixes = [_tokens(rng, prefix_len) for _ in range(groups)]
        times = _arrival_times(rate, rng)
        for i in range(num_requests):
            prompt = prefixes[i % groups] + _tokens(rng, prompt_len - prefix_len)
            params = SamplingParams(max_new_tokens=output_len, stream=stream)
            req = Req(rid=f"w{i}", origin_input_ids=prompt, sampling_params=params)
            yield Arrival(next(times), req)

    return GeneratedWorkload(arrivals)


# A conversation start rate at which the default scheduler queues requests and its prefix
# cache is under pressure: the regime where the scheduling policy matters.
CHAT_RATE = 16.0

SYNTHETIC = {
    "chat": f"multi-turn chats over 32 shared system prompts, {CHAT_RATE:g} conversations/s",
    "shared-prefix": "512-token prompts in 20 groups sharing a 384-token prefix, 128 tokens out",
}


def synthetic(name: str, num_requests: int, rate: float | None, seed: int) -> Workload:
    """The built-in workload called ``name`` (see ``SYNTHETIC``); ``rate`` None takes the
    workload's own default (``inf`` starts everything at once)."""
    if name == "chat":
        return ChatWorkload(num_requests=num_requests, rate=rate or CHAT_RATE, seed=seed)
    if name == "shared-prefix":
        return shared_prefix_workload(num_requests=num_requests, rate=rate, seed=seed, stream=True)
    raise ValueError(f"unknown synthetic workload {name!r}; valid: {', '.join(SYNTHETIC)}")


class _Line(msgspec.Struct, forbid_unknown_fields=True):
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


def _line_problem(line: _Line) -> str | None:
    if (line.input_ids is None) == (line.prompt_len is None):
        return "give exactly one of 'input_ids' or 'prompt_len'"
    if line.input_ids is not None and (not line.input_ids or min(line.input_ids) < 0):
        return "'input_ids' must be a non-empty list of non-negative token ids"
    if line.prompt_len is not None and line.prompt_len < 1:
        return "'prompt_len' must be >= 1"
    if line.prompt_len is not None and not 0 <= line.prefix_len <= line.prompt_len:
        return "'prefix_len' must be between 0 and 'prompt_len'"
    if line.arrival is not None and line.arrival < 0:
        return "'arrival' must be >= 0 seconds"
    params = SamplingParams(
        max_new_tokens=line.max_new_tokens,
        stop_token_ids=tuple(line.stop_token_ids),
        stream_interval=line.stream_interval,
    )
    return params.validation_error()


def load_jsonl(path: str | Path, rate: float | None = None, seed: int = 0) -> StaticWorkload:
    """Read a JSONL workload file; every bad line is reported (``WorkloadError``)."""
    rng = random.Random(seed)
    decoder = msgspec.json.Decoder(_Line)
    errors, lines, rids = [], [], set()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise WorkloadError([f"{path}: cannot read workload file: {exc.strerror}"]) from None
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        try:
            line = decoder.decode(raw)
        except msgspec.DecodeError as exc:
            errors.append(f"{path}:{number}: {exc}")
            continue
        problem = _line_problem(line)
        if line.rid is not None and line.rid in rids:
            problem = f"rid {line.rid!r} is used by an earlier line; rids must be unique"
        rids.add(line.rid)
        if problem:
            errors.append(f"{path}:{number}: {problem}")
            continue
        lines.append((number, line))
    if errors:
        raise WorkloadError(errors)
    if not lines:
        raise WorkloadError([f"{path}: no requests in the file"])
    times = _arrival_times(rate, rng)
    prefixes: dict[str, list[int]] = {}
    arrivals = []
    for number, line in lines:
        if line.input_ids is not None:
            prompt = line.input_ids
        else:
            prefix = []
            if line.prefix_group is not None:
                known = prefixes.setdefault(line.prefix_group, [])
                known += _tokens(rng, max(0, line.prefix_len - len(known)))
                prefix = known[: line.prefix_len]
            prompt = prefix + _tokens(rng, line.prompt_len - len(prefix))
        params = SamplingParams(
            max_new_tokens=line.max_new_tokens,
            stop_token_ids=tuple(line.stop_token_ids),
            ignore_eos=line.ignore_eos,
            stream=line.stream,
            stream_interval=line.stream_interval,
        )
        rid = line.rid or f"line{number}"
        time = line.arrival if line.arrival is not None else next(times)
        arrivals.append(
            Arrival(time, Req(rid=rid, origin_input_ids=prompt, sampling_params=params))
        )
    arrivals.sort(key=lambda a: a.time)
    return StaticWorkload(arrivals)
