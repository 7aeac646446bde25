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

Every bad line is reported with its line number, as ``FILE:LINE: column: problem``.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

from schedkit.runner.calibrate import TERMS, CalibrationError, Step

__all__ = ["COLUMNS", "read_steps"]

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
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            problems.append(f"{column}: expected a whole number >= {minimum}, got {text!r}")
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
    if not (math.isfinite(step_ms) and step_ms > 0):
        problems.append(f"step_time_ms: expected a number of milliseconds > 0, got {text!r}")
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


def read_steps(path: str | os.PathLike) -> list[Step]:
    """The steps of a calibration CSV; ``CalibrationError`` with every bad line as
    ``FILE:LINE: column: problem``."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read: {exc}") from None
    numbered = [
        (n, line) for n, line in enumerate(lines, 1) if line.strip() and not line.startswith("#")
    ]
    if not numbered:
        raise CalibrationError(f"{path}: no header line; expected columns from {COLUMNS}")
    header_line, header_text = numbered[0]
    header = [c.strip() for c in next(csv.reader([header_text]))]
    valid = ", ".join(COLUMNS)
    errors = [
        f"{path}:{header_line}: unknown column {c!r}; valid columns: {valid}"
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
        raise CalibrationError(errors)
    steps: list[Step] = []
    for n, text in numbered[1:]:
        cells = [c.strip() for c in next(csv.reader([text]))]
        if len(cells) != len(header):
            errors.append(f"{path}:{n}: {len(cells)} fields, the header has {len(header)}")
            continue
        step, problems = _parse_row(dict(zip(header, cells, strict=True)))
        errors += [f"{path}:{n}: {p}" for p in problems]
        if step is not None:
            steps.append(step)
    if len(errors) > _MAX_REPORTED:
        errors = [*errors[:_MAX_REPORTED], f"... and {len(errors) - _MAX_REPORTED} more"]
    if errors:
        raise CalibrationError(errors)
    if not steps:
        raise CalibrationError(f"{path}: no steps after the header")
    return steps
