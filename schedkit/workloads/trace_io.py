"""Reading trace files a record at a time, and reporting their bad lines briefly.

Every reader streams: JSONL and CSV (here) a line at a time, a JSON array (ShareGPT,
``json_array``) an item at a time, so a file of any size costs the memory of one record, and a
record is bounded: a line or an item over ``MAX_LINE_BYTES``, a CSV field over Python's csv
limit (131,072 characters; the rest of the file is then not read) or a value nested too deep to
decode is a problem at its line, never read whole. Only regular files are read
(``open_regular``: not a device, a pipe or a directory). ``ProblemLog`` collects the bad lines
and reports each distinct problem once, at its first line, with a count of the others.
"""

from __future__ import annotations

import codecs
import csv
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import msgspec

from schedkit.workloads.workload import WorkloadError

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_REQUEST_TOKENS",
    "MAX_TRACE_SECONDS",
    "ProblemLog",
    "decode_lines",
    "describe_decode_error",
    "iter_csv_rows",
    "iter_lines",
    "open_regular",
]

# The longest line (or ShareGPT item) read: a JSONL line of a 1M-token prompt is ~8 MB.
MAX_LINE_BYTES = 16 << 20
# The most prompt or output tokens of one request in a trace (2**20, as the serve edge's
# waiting limit per client); a count over it is a problem at its line.
MAX_REQUEST_TOKENS = 1 << 20
# The longest a trace may span, in seconds from its first arrival (~3 years): past it a
# float clock loses the step times a run measures.
MAX_TRACE_SECONDS = 1e8
_TOO_DEEP = "a value nested too deep to decode (deeper than Python's recursion limit)"

# Problems that differ only in numbers (a line's value, an index) are the same problem.
_NUMBERS = re.compile(r"\d+(\.\d+)?")
_SHOWN_KINDS = 20
_SHOWN_LINES = 5


@attrs.define(slots=True)
class _Kind:
    first_line: int
    message: str
    more_lines: list[int]
    more: int = 0


class ProblemLog:
    """The problems and skipped records of one file, each kind kept as its first line and a
    count, so a file with a million bad lines reports a few lines."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self._problems: dict[str, _Kind] = {}
        self._skips: dict[str, list[int]] = {}  # reason -> [first line, count]

    def add(self, line: int, problem: str, kind: str | None = None) -> None:
        """Record ``problem`` at ``line``; problems of the same ``kind`` (by default the text
        with its numbers left out) are reported together."""
        key = kind or _NUMBERS.sub("#", problem)
        found = self._problems.get(key)
        if found is None:
            self._problems[key] = _Kind(line, problem, [])
            return
        found.more += 1
        if len(found.more_lines) < _SHOWN_LINES:
            found.more_lines.append(line)

    def skip(self, line: int, reason: str) -> None:
        """Record a well-formed record that cannot run (e.g. zero output tokens)."""
        self._skips.setdefault(reason, [line, 0])[1] += 1

    def __bool__(self) -> bool:
        return bool(self._problems)

    def errors(self) -> list[str]:
        """``FILE:LINE: problem`` for each kind of problem, with how many more lines have it."""
        out = []
        for kind in list(self._problems.values())[:_SHOWN_KINDS]:
            message = kind.message
            if kind.more:
                lines = ", ".join(map(str, kind.more_lines))
                lines += ", ..." if kind.more > len(kind.more_lines) else ""
                plural = "s" if kind.more > 1 else ""
                message += f" (and {kind.more} more line{plural} like it: {lines})"
            out.append(f"{self.path}:{kind.first_line}: {message}")
        hidden = len(self._problems) - _SHOWN_KINDS
        if hidden > 0:
            out.append(f"{self.path}: {hidden} more kinds of problem not shown")
        return out

    def notes(self) -> list[str]:
        """What was skipped and why, one line per reason."""
        return [
            f"{self.path}: skipped {n} record{'s' * (n > 1)} ({reason}), the first at line {line}"
            for reason, (line, n) in self._skips.items()
        ]

    def raise_if_any(self) -> None:
        """Raise ``WorkloadError`` with ``errors()`` if there are problems."""
        if self:
            raise WorkloadError(self.errors())


def describe_decode_error(exc: msgspec.DecodeError, struct: type[msgspec.Struct]) -> str:
    """msgspec's message, plus the fields ``struct`` takes when a field is unknown or missing."""
    message = str(exc)
    if "unknown field" in message or "missing required field" in message:
        info = msgspec.inspect.type_info(struct)
        message += f"; valid fields: {', '.join(f.encode_name for f in info.fields)}"
        required = [f.encode_name for f in info.fields if f.required]
        message += f" (required: {', '.join(required)})" if required else ""
    return message


def _open_error(path: str | Path, exc: OSError) -> WorkloadError:
    return WorkloadError([f"{path}: cannot read the file: {exc.strerror or exc}"])


def open_regular(path: str | Path, mode: str = "rb", **kwargs: Any) -> Any:
    """``open(path, mode)`` for a regular file; ``WorkloadError`` for anything else (a device
    such as /dev/zero, a pipe, a directory, a missing file or a dangling link)."""
    try:
        kind = os.stat(path).st_mode
        if not stat.S_ISREG(kind):
            what = "a directory" if stat.S_ISDIR(kind) else "a device or a pipe"
            raise WorkloadError([f"{path}: not a regular file ({what}); give a trace file"])
        return open(path, mode, **kwargs)
    except OSError as exc:
        raise _open_error(path, exc) from None


def _long_line(log: ProblemLog, number: int) -> None:
    log.add(number, f"a line of more than {MAX_LINE_BYTES} bytes (not read)", kind="long line")


def iter_lines(path: str | Path, log: ProblemLog) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of each line that is not blank or a ``#`` comment (a UTF-8
    byte-order mark at the start of the file is dropped); a line over ``MAX_LINE_BYTES`` goes
    to ``log`` and is skipped without being held."""
    with open_regular(path) as file:
        number = 0
        while raw := file.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                _long_line(log, number)
                while (rest := file.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass
                continue
            stripped = raw.removeprefix(codecs.BOM_UTF8).strip() if number == 1 else raw.strip()
            if stripped and not stripped.startswith(b"#"):
                yield number, stripped


def decode_lines(
    path: str | Path, struct: type[msgspec.Struct], log: ProblemLog
) -> Iterator[tuple[int, Any]]:
    """``(line number, struct)`` of each JSONL line that decodes as ``struct``; the others go
    to ``log`` with msgspec's message and the valid fields (or why it is not JSON text)."""
    decoder = msgspec.json.Decoder(struct)
    for number, raw in iter_lines(path, log):
        try:
            decoded = decoder.decode(raw)
        except msgspec.DecodeError as exc:
            log.add(number, describe_decode_error(exc, struct))
            continue
        except UnicodeDecodeError as exc:
            log.add(number, f"not UTF-8 text ({exc.reason} at byte {exc.start} of the line)")
            continue
        except RecursionError:
            log.add(number, _TOO_DEEP)
            continue
        yield number, decoded


def decode_item(
    decoder: msgspec.json.Decoder, text: str | bytes, number: int, log: ProblemLog
) -> Any | None:
    """``text`` decoded, or None after reporting why it does not decode at ``number``."""
    try:
        return decoder.decode(text)
    except msgspec.DecodeError as exc:
        log.add(number, describe_decode_error(exc, decoder.type))
    except RecursionError:
        log.add(number, _TOO_DEEP)
    return None


class _LongLine(Exception):
    def __init__(self, number: int) -> None:
        self.number = number


def _bounded_lines(file: Any) -> Iterator[str]:
    number = 0
    while line := file.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES:
            raise _LongLine(number)
        yield line


def iter_csv_rows(
    path: str | Path, columns: tuple[str, ...], log: ProblemLog
) -> Iterator[tuple[int, list[str]]]:
    """``(line number, values of columns)`` of each CSV row, the columns found by name in the
    header (others are ignored); a header without them is one problem and no rows."""
    file = open_regular(path, "r", newline="", encoding="utf-8-sig", errors="replace")
    with file:
        reader = csv.reader(_bounded_lines(file))
        try:
            header = [name.strip() for name in next(reader, [])]
            missing = [c for c in columns if c not in header]
            if missing:
                log.add(1, f"the header lacks {', '.join(missing)}; it needs {', '.join(columns)}")
                return
            repeated = [c for c in columns if header.count(c) > 1]
            if repeated:
                log.add(
                    1, f"the header names {', '.join(repeated)} more than once; which is meant?"
                )
                return
            where = [header.index(c) for c in columns]
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    problem = f"{len(row)} values where the header has {len(header)}"
                    log.add(reader.line_num, problem)
                    continue
                yield reader.line_num, [row[i].strip() for i in where]
        except _LongLine as exc:  # csv cannot resume inside a record: the rest is not read
            _long_line(log, exc.number)
        except csv.Error as exc:
            log.add(reader.line_num, f"not CSV: {exc} (the rest of the file is not read)")
