"""Workloads for ``schedkit run``: the protocol the driver pulls arrivals through, and the
built-in synthetic traffic. Files (schedkit's JSONL and public traces) are read by
``schedkit.workloads.traces``.

A workload hands the driver its first arrivals and, when a request finishes, may return a
follow-up (a multi-turn chat's next turn, whose prompt is the whole conversation so far).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import attrs

from schedkit.core.schedule_batch import Req, SamplingParams

__all__ = [
    "CHAT_RATE",
    "SYNTHETIC",
    "Arrival",
    "ChatWorkload",
    "GeneratedWorkload",
    "StaticWorkload",
    "Workload",
    "WorkloadError",
    "arrival_times",
    "random_tokens",
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


def arrival_times(rate: float | None, rng: random.Random) -> Iterator[float]:
    """Poisson arrival times at ``rate`` per second (all at 0 without a rate or with inf)."""
    t = 0.0
    while True:
        if rate and rate != float("inf"):
            t += rng.expovariate(rate)
        yield t


def random_tokens(rng: random.Random, n: int) -> list[int]:
    """``n`` token ids drawn uniformly from ``VOCAB`` with ``rng``."""
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

    With ``separate_streams`` arrival times, the first turns and each follow-up draw from random
    streams of their own (all derived from ``seed``), so two rates give the same conversations
    and the same follow-up turns whatever order the answers finish in: only the arrival times
    differ. Without it (the default) one stream serves all, as the built-in ``chat`` workload
    has always drawn it.
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
    separate_streams: bool = False
    _rng: random.Random = attrs.field(init=False)
    _remaining_turns: dict[str, int] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def _request(self, rng: random.Random, rid: str, prompt: list[int], time: float) -> Arrival:
        params = SamplingParams(max_new_tokens=rng.randint(*self.output_len), stream=True)
        return Arrival(time, Req(rid=rid, origin_input_ids=prompt, sampling_params=params))

    def initial(self) -> Iterator[Arrival]:
        """The conversations' first turns, generated as they are pulled."""
        rng = self._rng
        systems = [
            random_tokens(rng, rng.randint(*self.system_prompt_len))
            for _ in range(self.num_system_prompts)
        ]
        times = arrival_times(
            self.rate, random.Random(f"{self.seed}:arrivals") if self.separate_streams else rng
        )
        left = self.num_requests
        for i in itertools.count():
            if left <= 0:
                return
            n = min(left, rng.randint(1, self.max_turns))
            left -= n
            prompt = rng.choice(systems) + random_tokens(rng, rng.randint(*self.user_len))
            self._remaining_turns[f"c{i}"] = n - 1
            yield self._request(rng, f"c{i}-t0", prompt, next(times))

    def follow_up(self, req: Req, now: float) -> Arrival | None:
        conversation, _, turn = req.rid.rpartition("-t")
        left = self._remaining_turns.pop(conversation, 0)
        if left <= 0 or req.output_ids == []:
            return None
        self._remaining_turns[conversation] = left - 1
        rid = f"{conversation}-t{int(turn) + 1}"
        rng = random.Random(f"{self.seed}:{rid}") if self.separate_streams else self._rng
        prompt = [  # the prompt may be packed (array('I')) while it waited at a router
            *req.origin_input_ids,
            *req.output_ids,
            *random_tokens(rng, rng.randint(*self.user_len)),
        ]
        return self._request(rng, rid, prompt, now + self.think_time)


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
        prefixes = [random_tokens(rng, prefix_len) for _ in range(groups)]
        times = arrival_times(rate, rng)
        for i in range(num_requests):
            prompt = prefixes[i % groups] + random_tokens(rng, prompt_len - prefix_len)
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
