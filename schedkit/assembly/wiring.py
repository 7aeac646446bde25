"""Loading a wiring: YAML files (or mappings) that declare components, merged with overlays.

A wiring file looks like::

    plugins: [my_pkg.components]
    components:
      tree_cache:
        type: radix_cache
        args: {page_size: 16}
      kv_events_publisher:
        type: kv_events_publisher
        args:
          tree_cache: !ref tree_cache
          get_stats: !late metrics_reporter.stats
          endpoint: ${KV_ENDPOINT:-tcp://127.0.0.1:5557}

Loading keeps the file and line of every component, type and argument so that validation
errors can name them. ``load_wiring`` loads, merges and validates; it raises ``WiringError``
carrying every problem found.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Literal

import attrs

__all__ = [
    "INVALID",
    "ComponentSpec",
    "EnvStr",
    "Ref",
    "Wiring",
    "WiringError",
    "call",
    "iter_refs",
    "late",
    "ref",
]

RefKind = Literal["ref", "late", "call"]
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


class WiringError(Exception):
    """A wiring could not be loaded, validated or built. ``errors`` lists every problem."""

    def __init__(self, errors: list[str] | str) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("\n".join(self.errors))


@attrs.frozen
class Ref:
    """A reference to another component: ``!ref`` (eager), ``!late`` or ``!call`` (late)."""

    kind: RefKind
    target: str
    attrs: tuple[str, ...] = ()
    file: str = "<mapping>"
    line: int | None = None

    @property
    def eager(self) -> bool:
        return self.kind == "ref"

    def __str__(self) -> str:
        return f"!{self.kind} {'.'.join((self.target, *self.attrs))}"


def _make_ref(kind: RefKind, text: str, file: str = "<mapping>", line: int | None = None) -> Ref:
    if not _TARGET.match(text):
        raise ValueError(
            f"!{kind} {text!r} is not a reference; write !{kind} component or "
            f"!{kind} component.attribute"
        )
    target, *attributes = text.split(".")
    private = [a for a in attributes if a.startswith("_")]
    if private:
        raise ValueError(
            f"!{kind} {text}: {private[0]!r} is private (it starts with an underscore); a "
            f"reference reaches a component's public attributes only"
        )
    if kind == "call" and not attributes:
        raise ValueError(f"!call {text} names no method; write !call {text}.method_name")
    return Ref(kind, target, tuple(attributes), file, line)


def ref(target: str) -> Ref:
    """An eager reference, for wirings written as Python mappings: the shared instance."""
    return _make_ref("ref", target)


def late(target: str) -> Ref:
    """A late reference: a zero-argument callable returning ``target`` at call time."""
    return _make_ref("late", target)


def call(target: str) -> Ref:
    """A late call: a callable forwarding its arguments to ``target`` at call time."""
    return _make_ref("call", target)


class _Invalid:
    """Stands for a value whose problem was already reported while reading it."""

    def __repr__(self) -> str:
        return "<invalid>"


INVALID = _Invalid()


class EnvStr(str):
    """A string produced by ``${VAR}`` interpolation; validation converts it leniently."""

    __slots__ = ()


@attrs.define
class ComponentSpec:
    """One component entry after overlays: its type, arguments, and where each came from."""

    name: str
    type: str | None
    args: dict[str, Any]
    file: str
    line: int | None
    type_loc: tuple[str, int | None]
    arg_locs: dict[str, tuple[str, int | None]]
    cls: type | None = None
    # Created by an overlay that named no component of earlier files (a typo, usually).
    created_by_overlay: bool = False

    def where(self, key: str | None = None) -> str:
        """``FILE:LINE`` of the entry, of its ``type`` (key ``"type"``) or of an argument
        (``"name"``, or ``"name.key"`` for a key of a mapping argument; a key no file set is
        placed at the mapping that holds it)."""
        key = self.located_key(key)
        if key == "type":
            file, line = self.type_loc
        elif key is not None:
            file, line = self.arg_locs[key]
        else:
            file, line = self.file, self.line
        return file if line is None or file == "<mapping>" else f"{file}:{line}"

    def located_key(self, key: str | None) -> str | None:
        """``key``, or the longest ``.``-prefix of it that a file set (None if none did)."""
        if key is None or key == "type":
            return key
        while key not in self.arg_locs:
            key, dot, _ = key.rpartition(".")
            if not dot:
                return None
        return key


@attrs.define
class Wiring:
    """A merged, validated wiring: component specs in declaration order, and plugin modules."""

    components: dict[str, ComponentSpec]
    plugins: list[tuple[str, str, int | None]]
    sources: list[str]
    validated: bool = False


def iter_refs(value: Any) -> Iterator[Ref]:
    """Every ``Ref`` inside an argument value (which may nest lists and mappings)."""
    if isinstance(value, Ref):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from iter_refs(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_refs(item)
