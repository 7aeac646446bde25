"""Reading a calibration CSV: measured forward steps for ``schedkit calibrate``.

The CSV has a header line naming its columns, then one line per measured forward step (blank
lines and lines starting with ``#`` are skipped; an empty cell is a value left out)::

    mode             prefill or decode
    batch_size       requests in the step
    new_tokens       prefill: tokens computed in the step (the sum of the extend lengths)
    attention_pairs  prefill: the causal (query, key) pairs of the step, summed over its
                     requests: new x prefix + new x (new + 1) / 2; may be left out of a
                     one-request step, which then derives it from new_tokens and context_tokens
    context_tokens   decode: the sum of the requests' lengths (prompt + output so far);
                     prefill: the request's length after the step (one-request steps)
    step_time_ms     the measured time of the step, the scheduler's own work included

Every bad line is reported with its line number, as ``FILE:LINE: column: problem``. Reading
is bounded: lines of at most ``MAX_LINE_CHARS`` characters, at most ``MAX_STEPS`` steps (a fit
needs a few hundred per mode), and every value within ``BOUNDS`` (so that no sum of the fit
overflows a float).
"""

from __future__ import annotations

import csv
import math
import os
import stat
from collections.abc import Iterator

from schedkit.runner.calibrate import TERMS, CalibrationError, Step

__all__ = ["BOUNDS", "COLUMNS", "MAX_LINE_CHARS", "MAX_STEPS", "read_steps"]

MAX_LINE_CHARS = 4096
MAX_STEPS = 100_000
# The largest value each column takes: far past any real step, small enough that squares
# summed over MAX_STEPS rows stay finite floats.
BOUNDS: dict[str, float] = {
    "batch_size": 1 << 20,
    "new_tokens": 1 << 30,
    "attention_pairs": 1 << 60,
    "context_tokens": 1 << 40,
    "step_time_ms": 3.6e6,  # an hour
}

COLUMNS = (
    "mode",
    "batch_size",
    "new_tokens",
    "attention_pairs",
    "context_tokens",
    "step_time_ms",
)
_REQUIRED = ("mode", "batch_size", "step_time_ms")
_MAX_REPORTED = 50


def _parse_row(values: dict[str, str]) -> tuple[Step | None, list[str]]:
    """A ``Step`` from one line's cells, or the problems, each ``column: problem``."""
    problems: list[str] = []
    bad: set[str] = set()

    def integer(column: str, minimum: int) -> int | None:
        text = values.get(column, "")
        if not text:
            return None
        try:
            value = int(text) if len(text) <= 20 else math.inf
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= BOUNDS[column]:
            shown = repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"
            problems.append(
                f"{column}: expected a whole number in [{minimum}, {BOUNDS[column]:.0f}], "
                f"got {shown}"
            )
            bad.add(column)
            return None
        return value

    mode = values.get("mode", "")
    if mode not in TERMS:
        problems.append(f"mode: expected prefill or decode, got {mode!r}")
    batch_size = integer("batch_size", 1)
    new_tokens = integer("new_tokens", 1)
    pairs = integer("attention_pairs", 0)
    context = integer("context_tokens", 0)
    text = values.get("step_time_ms", "")
    try:
        step_ms = float(text)
    except ValueError:
        step_ms = math.nan
    if not 0 < step_ms <= BOUNDS["step_time_ms"]:
        shown = repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"
        problems.append(
            f"step_time_ms: expected milliseconds in (0, {BOUNDS['step_time_ms']:.0f}], got {shown}"
        )
    if batch_size is None and "batch_size" not in bad:
        problems.append("batch_size: missing")
    if mode == "prefill" and new_tokens is None and "new_tokens" not in bad:
        problems.append("new_tokens: missing (the tokens a prefill step computes)")
    if mode == "prefill" and pairs is None and "attention_pairs" not in bad:
        if context is not None and batch_size == 1 and new_tokens is not None:
            prefix = context - new_tokens
            pairs = new_tokens * prefix + new_tokens * (new_tokens + 1) // 2
            if context < new_tokens:
                problems.append(
                    f"context_tokens: the request's length after the step ({context}) cannot "
                    f"be below its new_tokens ({new_tokens})"
                )
        elif "context_tokens" not in bad:
            problems.append(
                "attention_pairs: missing; give it (the sum of new x prefix + new x (new + 1) "
                "/ 2 over the requests), or context_tokens for a one-request step"
            )
    if mode == "decode" and context is None and "context_tokens" not in bad:
        problems.append("context_tokens: missing (the sum of a decode step's request lengths)")
    if problems:
        return None, problems
    step = Step(
        mode=mode,
        batch_size=batch_size or 0,
        new_tokens=new_tokens or 0,
        attention_pairs=pairs or 0,
        context_tokens=context or 0,
        step_time=step_ms / 1000,
    )
    return step, []


def _lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """``(number, text)`` of the lines that are not blank or comments; ``CalibrationError``
    for a file that is not a regular UTF-8 text file or a line over ``MAX_LINE_CHARS``."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise CalibrationError(f"{path}: not a regular file (a device, a pipe or a directory)")
        # utf-8-sig: a byte-order mark (spreadsheets write one) is not part of the header.
        with open(path, encoding="utf-8-sig") as file:
            number = 0
            while line := file.readline(MAX_LINE_CHARS + 1):
                number += 1
                if len(line) > MAX_LINE_CHARS:
                    raise CalibrationError(
                        f"{path}:{number}: a line of more than {MAX_LINE_CHARS} characters"
                    )
                if line.strip() and not line.startswith("#"):
                    yield number, line
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CalibrationError(f"{path}: not UTF-8 text ({exc.reason})") from None


def read_steps(path: str | os.PathLike) -> list[Step]:
    """The steps of a calibration CSV; ``CalibrationError`` with every bad line as
    ``FILE:LINE: column: problem``."""
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        raise CalibrationError(f"{path}: no header line; expected columns from {COLUMNS}")
    header_line, header_text = first
    header = [c.strip() for c in next(csv.reader([header_text]))]
    valid = ", ".join(COLUMNS)
    errors = [
        f"{path}:{header_line}: unknown column {c[:40]!r}; valid columns: {valid}"
        for c in header
        if c not in COLUMNS
    ]
    errors += [
        f"{path}:{header_line}: column {c!r} given twice"
        for c in sorted(set(header))
        if header.count(c) > 1
    ]
    errors += [
        f"{path}:{header_line}: missing column {c!r}; required: {', '.join(_REQUIRED)}"
        for c in _REQUIRED
        if c not in header
    ]
    if errors:
        raise CalibrationError(errors[:_MAX_REPORTED])
    steps: list[Step] = []
    more = 0
    for n, text in lines:
        if len(steps) >= MAX_STEPS:
            raise CalibrationError(
                f"{path}:{n}: more than {MAX_STEPS} steps; a fit needs a few hundred per mode"
            )
        cells = [c.strip() for c in next(csv.reader([text]))]
        if len(cells) != len(header):
            problems = [f"{len(cells)} fields, the header has {len(header)}"]
            step = None
        else:
            step, problems = _parse_row(dict(zip(header, cells, strict=True)))
        if len(errors) < _MAX_REPORTED:
            errors += [f"{path}:{n}: {p}" for p in problems]
        else:
            more += len(problems)
        if step is not None:
            steps.append(step)
    if more:
        errors.append(f"... and {more} more")
    if errors:
        raise CalibrationError(errors)
    if not steps:
        raise CalibrationError(f"{path}: no steps after the header")
    return steps
