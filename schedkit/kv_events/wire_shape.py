"""Which engine's encoding a KV-event payload is.

A payload is what profile P sends when it decodes with P's engine declarations and those
declarations, given what was decoded, encode the same structure back: the same fields, None fields
sent or left out as that engine does (SGLang leaves them out, vLLM always sends ``medium`` and
``lora_name``), events as maps or as tagged arrays. A vLLM payload decodes with SGLang's
declarations too, so decoding alone would not tell them apart.
"""

from __future__ import annotations

from typing import Any

import msgspec

from schedkit.kv_events.structs import MAX_BATCH_BYTES, PROFILES, get_profile

__all__ = ["shape_problems"]

_decode_generic = msgspec.msgpack.Decoder().decode
_REPR_LIMIT = 40


def shape_problems(payload: bytes) -> dict[str, str | None]:
    """For each profile in ``PROFILES``: None when ``payload`` is exactly what that profile
    sends, else the first reason it is not (naming the place, e.g. ``$[1][0]``)."""
    if len(payload) > MAX_BATCH_BYTES:
        return dict.fromkeys(PROFILES, f"{len(payload)} bytes, over the bound of {MAX_BATCH_BYTES}")
    try:
        sent = _decode_generic(payload)
        # The batch's rank is optional: an engine that leaves defaults out sends [ts, events].
        if isinstance(sent, list) and len(sent) == 2:
            sent = [*sent, None]
        return {name: _problem(payload, sent, name) for name in PROFILES}
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        return dict.fromkeys(PROFILES, f"not msgpack ({exc})")
    except RecursionError:  # decoding, comparing or showing a value nested ~1,000 deep
        return dict.fromkeys(PROFILES, "nested too deep to decode")


def _problem(payload: bytes, sent: Any, name: str) -> str | None:
    profile = get_profile(name)
    try:
        expected = _decode_generic(profile.reencode(payload))
    except (msgspec.DecodeError, msgspec.EncodeError, OverflowError) as exc:
        return f"does not decode with {name}'s declarations: {exc}"
    return _difference(sent, expected, "$", name)


def _difference(sent: Any, expected: Any, path: str, name: str) -> str | None:
    if sent == expected and type(sent) is type(expected):
        return None
    if isinstance(expected, dict):
        if not isinstance(sent, dict):
            return f"{path} is {_kind(sent)}, {name} sends a map"
        for key in expected:
            if key not in sent:
                return f"{path} lacks {key!r}, which {name} always sends"
        for key, value in sent.items():
            if key not in expected:
                return f"{path} has {key!r}: {_short(value)}, which {name} leaves out"
        for key, value in expected.items():
            found = _difference(sent[key], value, f"{path}.{key}", name)
            if found:
                return found
        return None
    if isinstance(expected, list):
        if not isinstance(sent, list):
            return f"{path} is {_kind(sent)}, {name} sends an array"
        if len(sent) != len(expected):
            return f"{path} has {len(sent)} items, {name} sends {len(expected)}"
        for i, (a, b) in enumerate(zip(sent, expected, strict=True)):
            found = _difference(a, b, f"{path}[{i}]", name)
            if found:
                return found
        return None
    if sent == expected:  # an int where a float is declared: the same value
        return None
    return f"{path} is {_short(sent)}, {name} sends {_short(expected)}"


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a map"
    if isinstance(value, list):
        return "an array"
    return _short(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."
