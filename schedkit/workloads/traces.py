"""Trace files as workloads: ``open_trace`` is the one entry point (``schedkit run --workload``
and the fleet command both call it); ``write_mooncake_like`` (``mooncake_writer``) writes a
Mooncake-shaped trace.

A trace is read twice, a record at a time, never whole: once when opened, to report every bad
line before anything runs (each distinct problem once, at its first line, with a count) and to
count the requests; then again as the driver's clock reaches each arrival, making each
request's tokens only then. Formats are in ``schedkit.workloads.trace_formats``.

schedkit's own JSONL format (``--format jsonl``), one request per line (blank lines and lines
starting with ``#`` are skipped)::

    {"input_ids": [1, 2, 3], "max_new_tokens": 64}
    {"prompt_len": 512, "prefix_group": "sys-a", "prefix_len": 384, "max_new_tokens": 128,
     "arrival": 0.25, "rid": "r-7", "stop_token_ids": [2], "ignore_eos": false,
     "stream": true, "stream_interval": 4, "priority": 3, "cache_salt": "user-9",
     "extra_key": "lora-a", "routing_key": "conv-7"}

Give either ``input_ids`` or ``prompt_len`` (random tokens from the seed; lines with the same
``prefix_group`` share their first ``prefix_len`` tokens). ``arrival`` (seconds) is optional:
lines without it arrive as a Poisson process at ``rate``, or all at once without a rate.
``priority`` is for the priority policies, ``routing_key`` for the routing-key policy;
``cache_salt`` and ``extra_key`` put the request's cached KV in a namespace of its own (as
SGLang does). A file whose arrivals are out of order, or that mixes lines with and without
``arrival``, is sorted as it is read through a window of the next 4,096 arrivals
(``sort_window``; a note says so); one out of order by more than that is refused at its first
such line. The timestamped formats (mooncake, azure, burstgpt) must be in time order. Every
timestamp must be finite and within ``MAX_TRACE_SECONDS`` of the first, and every count within
``MAX_REQUEST_TOKENS`` (``trace_io``).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from schedkit.core.schedule_batch import Req
from schedkit.workloads.mooncake_writer import write_mooncake_like
from schedkit.workloads.sniff import sniff_format
from schedkit.workloads.sort_window import SORT_WINDOW_ITEMS, SortWindow
from schedkit.workloads.trace_formats import FORMATS
from schedkit.workloads.trace_io import MAX_REQUEST_TOKENS, MAX_TRACE_SECONDS, ProblemLog
from schedkit.workloads.workload import Arrival, StaticWorkload, WorkloadError, arrival_times

__all__ = [
    "FORMATS",
    "TraceWorkload",
    "guess_format",
    "load_jsonl",
    "open_trace",
    "write_mooncake_like",
]


@attrs.define
class TraceWorkload:
    """A trace file's requests, read as they are pulled; no follow-ups. ``num_requests`` is
    how many it holds (after ``num_requests`` capping) and ``notes`` what was skipped."""

    path: Path
    format: str
    num_requests: int
    notes: list[str]
    _make: Callable[[], Iterator[Arrival]]

    def initial(self) -> Iterator[Arrival]:
        """The arrivals in time order, each request made when it is pulled; each call reads
        the file again from the start."""
        return self._make()

    def follow_up(self, req: Req, now: float) -> Arrival | None:
        """None: a trace's requests are all in the file."""
        return None


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def guess_format(path: str | Path) -> str:
    """The format of ``path`` by its extension where that is unambiguous: ``.json`` is
    ShareGPT, ``.csv`` is Azure or BurstGPT by its header (ValueError when the header is
    neither's), anything else is jsonl."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        sniffed = sniff_format(path)
        if sniffed is not None and sniffed[0] in ("azure", "burstgpt"):
            return sniffed[0]
        raise ValueError(f"{path}: a .csv trace is azure or burstgpt; say which with --format")
    return "sharegpt" if suffix == ".json" else "jsonl"


def _check_options(
    name: str, block_size: int, speedup: float, rate: float | None, num_requests: int | None
) -> None:
    if name not in FORMATS:
        raise ValueError(f"unknown trace format {name!r}; valid: {', '.join(FORMATS)}")
    if not isinstance(block_size, int) or not 1 <= block_size <= MAX_REQUEST_TOKENS:
        raise ValueError(
            f"block_size must be a whole number in [1, {MAX_REQUEST_TOKENS}] (the tokens a "
            f"request may have), got {block_size!r}"
        )
    if not 0 < speedup < math.inf:
        raise ValueError(f"speedup must be a finite number > 0, got {speedup!r}")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be > 0 (or inf), got {rate!r}")
    if rate is not None and FORMATS[name].timestamped:
        raise ValueError(
            f"a {name} trace has its own timestamps, so a rate does not apply (use speedup)"
        )
    if num_requests is not None and (not isinstance(num_requests, int) or num_requests < 1):
        raise ValueError(f"num_requests must be a whole number >= 1, got {num_requests!r}")


def open_trace(
    path: str | Path,
    fmt: str | None,
    *,
    block_size: int = 512,
    speedup: float = 1.0,
    rate: float | None = None,
    seed: int = 0,
    num_requests: int | None = None,
) -> TraceWorkload:
    """Check the trace at ``path`` and return it as a workload.

    ``fmt`` is one of ``FORMATS`` (None: ``guess_format``). ``block_size`` is the tokens per
    Mooncake hash id; arrival times are divided by ``speedup``; ``rate`` (Poisson arrivals per
    second, ``inf`` or None for all at once) is for formats without timestamps (sharegpt, and
    jsonl lines without ``arrival``); ``seed`` makes the random tokens of formats that carry
    only token counts; ``num_requests`` takes only the first that many requests. Bad lines
    raise ``WorkloadError`` (each distinct problem once, at its first line, with a count);
    bad options raise ``ValueError``.
    """
    path = Path(path)
    name = guess_format(path) if fmt is None else fmt
    _check_options(name, block_size, speedup, rate, num_requests)
    spec = FORMATS[name]
    log = ProblemLog(path)
    count, first, latest, timed, untimed, ordered = 0, None, None, 0, 0, True
    window = SortWindow()  # how the untimestamped formats' arrivals would be sorted
    with contextlib.closing(spec.records(path, log, block_size)) as records:
        for number, time, record in itertools.islice(records, num_requests):
            count += 1
            if time is None:
                untimed += 1
                if rate is None or rate == math.inf:  # at 0; with a rate, known when run
                    _sort_check(window, 0.0, number, record, log, path)
                continue
            timed += 1
            first = time if first is None else first
            if not abs(time - first) <= MAX_TRACE_SECONDS:
                log.add(
                    number,
                    f"arrives {time - first:.6g} s after the first request: more than the "
                    f"{MAX_TRACE_SECONDS:g} s a trace may span",
                    kind="span",
                )
                continue
            if latest is not None and time < latest[1]:
                ordered = False
                if spec.timestamped:
                    log.add(
                        number,
                        f"arrives at {time - first:.3f} s, before line {latest[0]} at "
                        f"{latest[1] - first:.3f} s (from the first request); a trace must be "
                        "in time order",
                        kind="order",
                    )
                    continue
            if not spec.timestamped:
                _sort_check(window, time, number, record, log, path)
            if latest is None or time >= latest[1]:
                latest = (number, time)
    if log:
        sniffed = sniff_format(path)
        if sniffed is not None and sniffed[0] != name:
            raise WorkloadError(
                [
                    f"{path}: this does not read as {_a(name)} trace, and looks like "
                    f"{_a(sniffed[0])} one ({sniffed[1]}): try --format {sniffed[0]}",
                    *log.errors(),
                ]
            )
    log.raise_if_any()
    if count == 0:
        raise WorkloadError([f"{path}: no requests in the file", *log.notes()])
    origin = first if spec.timestamped else 0.0

    def arrivals() -> Iterator[Arrival]:
        rng = random.Random(seed)
        make = spec.requests(rng, block_size)
        times = arrival_times(rate, rng)
        again = ProblemLog(path)
        with contextlib.closing(spec.records(path, again, block_size)) as records:
            for number, time, record in itertools.islice(records, count):
                if again:
                    raise WorkloadError([*again.errors(), f"{path}: the file changed while read"])
                req = make(number, record)
                at = next(times) if time is None else time - origin
                yield Arrival(at / speedup, req)

    notes = log.notes()
    if fmt is None and path.suffix.lower() == ".csv":
        notes.append(f"{path}: read as {name}, by its header; give --format to say otherwise")
    make = arrivals
    if not ordered or (timed and untimed):
        notes.append(
            f"{path}: arrivals are not in file order: they are sorted through a window of "
            f"{SORT_WINDOW_ITEMS} arrivals as the file is read"
        )

        def make() -> Iterator[Arrival]:
            return _sorted_arrivals(arrivals(), path)

    return TraceWorkload(path, name, count, notes, make)


def _tokens(record: object) -> int:
    """Prompt tokens a record's request holds (a jsonl line's, else 1)."""
    prompt_len = getattr(record, "prompt_len", None)
    ids = getattr(record, "input_ids", None)
    return max(1, prompt_len or 0, len(ids) if ids is not None else 0)


def _out_of_window(time: float, late: tuple[float, int]) -> str:
    return (
        f"arrives at {time:.3f} s, before line {late[1]} at {late[0]:.3f} s, which sorting "
        f"through a window of {SORT_WINDOW_ITEMS} arrivals has let out already; sort the file "
        "by arrival"
    )


def _sort_check(
    window: SortWindow, time: float, number: int, record: object, log: ProblemLog, path: Path
) -> None:
    late = window.late(time)
    if late is not None:
        log.add(number, _out_of_window(time, late), kind="window")
        return
    for _ in window.push(time, number, None, _tokens(record)):
        pass


def _sorted_arrivals(arrivals: Iterator[Arrival], path: Path) -> Iterator[Arrival]:
    window = SortWindow()
    for number, arrival in enumerate(arrivals, 1):
        late = window.late(arrival.time)
        if late is not None:  # only lines without 'arrival' at a rate get here unchecked
            problem = _out_of_window(arrival.time, late)
            raise WorkloadError([f"{path}: request {arrival.req.rid} {problem}"])
        yield from window.push(arrival.time, number, arrival, len(arrival.req.origin_input_ids))
    yield from window.drain()


def load_jsonl(path: str | Path, rate: float | None = None, seed: int = 0) -> StaticWorkload:
    """A schedkit JSONL workload read whole, sorted by arrival (``open_trace`` streams it)."""
    workload = open_trace(path, "jsonl", rate=rate, seed=seed)
    return StaticWorkload(sorted(workload.initial(), key=lambda a: a.time))
