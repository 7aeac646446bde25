"""Telling a trace's format from its first line, to name the right ``--format`` when a file
does not read as the format given (or to pick a CSV's format when none is given)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["sniff_format"]

_PEEK_BYTES = 64 * 1024  # a first line longer than this is not sniffed


def sniff_format(path: str | Path) -> tuple[str, str] | None:
    """``(format, why)`` when the file's first line says what it is, else None."""
    try:
        with open(path, "rb") as file:
            head = file.read(_PEEK_BYTES)
    except OSError:
        return None
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if text.startswith("["):
        return "sharegpt", "it is a JSON array"
    first = text.split("\n", 1)[0].strip()
    if first.startswith("{"):
        try:
            record = json.loads(first)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to tell
            return None
        if not isinstance(record, dict):
            return None
        if "hash_ids" in record or {"timestamp", "input_length"} <= record.keys():
            return "mooncake", "its lines have timestamp, input_length and hash_ids"
        if "input_ids" in record or "prompt_len" in record:
            return "jsonl", "its lines have input_ids or prompt_len"
        return None
    columns = {c.strip() for c in first.split(",")}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= columns:
        return "azure", "its header is TIMESTAMP,ContextTokens,GeneratedTokens (an Azure CSV)"
    if {"Timestamp", "Request tokens", "Response tokens"} <= columns:
        return "burstgpt", "its header has Timestamp, Request tokens, Response tokens (BurstGPT)"
    return None
