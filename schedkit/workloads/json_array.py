"""Reading a file that holds one JSON array (a ShareGPT trace) an item at a time: brackets are
counted outside strings, so only the item being read is held, and every way the array can be
malformed is a problem at its line (``trace_io.ProblemLog``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from schedkit.workloads.trace_io import MAX_LINE_BYTES, ProblemLog, open_regular

__all__ = ["iter_json_array"]

_STRUCTURE = re.compile(r'["\[\]{}]')
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.S)
_CHUNK = 1 << 20


def iter_json_array(
    path: str | Path, log: ProblemLog, chunk: int = _CHUNK
) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each item of a file holding one JSON array, read ``chunk``
    characters at a time: brackets are counted outside strings, so only the item being read
    is held. A string, number or missing comma between items, a comma after the last one, and
    text after the array are problems at their line."""
    with open_regular(path, "r", encoding="utf-8-sig", errors="replace") as file:
        buf, eof = file.read(chunk), False
        if not buf.lstrip().startswith("["):
            log.add(1, "expected a JSON array of conversations ([{...}, ...])")
            return
        line, counted = 1, 0  # buf[counted] is on line `line`
        depth, pos, start, gap, item_line, first = 0, 0, 0, 0, 0, True

        def line_of(i: int) -> int:
            nonlocal line, counted
            if i < counted:
                return line - buf.count("\n", i, counted)
            line += buf.count("\n", counted, i)
            counted = i
            return line

        while True:
            found = _STRUCTURE.search(buf, pos)
            end = _STRING_REST.match(buf, found.end()) if found and found.group() == '"' else None
            if found is None or (found.group() == '"' and end is None):
                if eof:
                    if depth:
                        log.add(line_of(len(buf)), "the JSON array is cut short (no closing ])")
                    return
                keep = start if depth >= 2 else gap if depth == 1 else pos
                if len(buf) - keep > MAX_LINE_BYTES:
                    where = item_line if depth >= 2 else line_of(keep)
                    text = f"an item of more than {MAX_LINE_BYTES} characters (not read further)"
                    log.add(where, text)
                    return
                line, counted = line_of(keep), 0
                buf, pos, start, gap = buf[keep:], pos - keep, start - keep, gap - keep
                more = file.read(chunk)
                buf, eof = buf + more, not more
                continue
            i, char = found.start(), found.group()
            if char == '"':
                pos = end.end()
                if depth == 1:
                    log.add(line_of(i), "expected an object, got a string")
                    gap = pos
                continue
            pos = i + 1
            if char in "[{":
                depth += 1
                if depth == 1:
                    gap = pos
                elif depth == 2:
                    between = buf[gap:i].strip()
                    if between != ("" if first else ","):
                        log.add(line_of(i), f"expected ',' between items, got {between[:20]!r}")
                    start, item_line, first = i, line_of(i), False
            else:
                depth -= 1
                if depth == 1:
                    yield item_line, buf[start:pos]
                    gap = pos
                elif depth <= 0:
                    between = buf[gap:i].strip()
                    if between == ",":
                        log.add(line_of(i), "a ',' after the last item (JSON allows none)")
                    elif between:
                        got = between.lstrip(",").strip()
                        log.add(line_of(i), f"expected an object, got {got[:20]!r}")
                    tail = pos
                    while not buf[tail:].strip():  # only white space may follow the array
                        more = file.read(chunk)
                        if not more:
                            return
                        tail, buf = len(buf), buf + more
                    extra = buf[tail:]
                    at = tail + len(extra) - len(extra.lstrip())
                    log.add(
                        line_of(at), f"text after the array's closing ]: {extra.strip()[:20]!r}"
                    )
                    return
