"""Reading one wiring YAML source (a file or a mapping) into plain values and ``Ref``s, with
the line of every key and value; the wiring's schema and the merge of overlays are
``yaml_reader``'s.

Reading is bounded and strict: a file that is not a regular file (a device such as /dev/zero,
a pipe) or is larger than ``MAX_FILE_BYTES`` is refused before it is read; a document that
expands past ``MAX_VALUES`` values or nests deeper than ``MAX_DEPTH`` is refused, and so are
non-UTF-8 bytes, duplicate keys, keys that are not plain names and tags other than ``!ref``,
``!late``, ``!call`` and ``!replace``; every problem is kept as
``FILE:LINE: path: problem`` for ``load_wiring`` to report together.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from schedkit.assembly.wiring import INVALID, EnvStr, Ref, _Invalid, _make_ref

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_VALUES",
    "DocumentReader",
    "Problems",
    "Replace",
    "TooLarge",
    "WiringDumper",
    "compose_file",
    "compose_mapping",
]

_ENV = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# Bounds on what reading one wiring may cost: a file of a few hundred bytes whose aliases
# expand to billions of values, or nesting that exhausts the stack, is refused.
MAX_VALUES = 100_000
MAX_DEPTH = 50
MAX_FILE_BYTES = 1 << 20  # the shipped wiring is ~10 KB
_PLAIN_TAGS = frozenset(
    f"tag:yaml.org,2002:{t}"
    for t in ("str", "int", "float", "bool", "null", "seq", "map", "timestamp")
)


class TooLarge(Exception):
    """Reading stopped: the document expands past ``MAX_VALUES`` values or ``MAX_DEPTH``."""

    def __init__(self, line: int, problem: str) -> None:
        self.line = line
        self.problem = problem


class Problems(list):
    """Problems found while reading, each kept as ``FILE:LINE: path: problem``."""

    def add(self, file: str, line: int | None, path: str, message: str) -> None:
        """Keep one problem; a mapping's (or a file-wide) problem has no line."""
        where = file if line is None or file == "<mapping>" else f"{file}:{line}"
        self.append(f"{where}: {path}: {message}" if path else f"{where}: {message}")


class DocumentReader:
    """Turns one YAML document into plain values and ``Ref``s, remembering lines."""

    def __init__(self, file: str, errors: Problems, overlay: bool = False) -> None:
        self.file = file
        self.errors = errors
        self.overlay = overlay  # merged over earlier sources: a null argument removes the key
        self.constructor = yaml.constructor.SafeConstructor()
        self.values_read = 0

    def count(self, node: yaml.Node, depth: int) -> None:
        """Count one value read; stop reading a document that is too large or too deep."""
        self.values_read += 1
        if self.values_read > MAX_VALUES:
            raise TooLarge(
                node.start_mark.line + 1,
                f"the document expands to more than {MAX_VALUES} values (aliases?); "
                "write it out plainly",
            )
        if depth > MAX_DEPTH:
            raise TooLarge(
                node.start_mark.line + 1, f"values nest more than {MAX_DEPTH} levels deep"
            )

    def key(self, node: yaml.Node, path: str) -> str | None:
        """A mapping key: a plain scalar, as text; None (reported) for anything else."""
        if isinstance(node, yaml.ScalarNode) and node.tag in _PLAIN_TAGS:
            return str(node.value)
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            got = "a mapping" if isinstance(node, yaml.MappingNode) else "a list"
        else:
            got = f"a value tagged {node.tag}"
        self.errors.add(
            self.file, node.start_mark.line + 1, path, f"a key must be a plain name, got {got}"
        )
        return None

    def plain_mapping(self, node: yaml.Node, path: str) -> bool:
        """False (reported) for a mapping or list carrying a tag, such as ``!!set`` or
        ``!ref``: read as a plain one, its tag would be silently ignored."""
        if isinstance(node, yaml.ScalarNode) or node.tag in _PLAIN_TAGS:
            return True
        self.errors.add(
            self.file,
            node.start_mark.line + 1,
            path,
            f"unknown tag {node.tag} here; write a plain mapping",
        )
        return False

    def items(self, node: yaml.MappingNode, path: str) -> list[tuple[str, int, yaml.Node]]:
        """The ``(key, line, value node)`` entries of a mapping; bad or repeated keys are
        reported and left out."""
        seen: dict[str, int] = {}
        entries = []
        for key_node, value_node in node.value:
            key = self.key(key_node, path)
            if key is None:
                continue
            line = key_node.start_mark.line + 1
            if key in seen:
                where = f"{path}.{key}" if path else key
                self.errors.add(
                    self.file, line, where, f"duplicate key (first given at line {seen[key]})"
                )
                continue
            seen[key] = line
            entries.append((key, line, value_node))
        return entries

    def value(self, node: yaml.Node, path: str, depth: int = 0) -> Any:
        """``node`` as a plain value, ``Ref`` or ``Replace``; ``INVALID`` (reported) if not one."""
        self.count(node, depth)
        line = node.start_mark.line + 1
        if node.tag in ("!ref", "!late", "!call"):
            if not isinstance(node, yaml.ScalarNode):
                self.errors.add(self.file, line, path, f"{node.tag} takes a component name")
                return INVALID
            try:
                return _make_ref(node.tag[1:], node.value.strip(), self.file, line)
            except ValueError as exc:
                self.errors.add(self.file, line, path, str(exc))
                return INVALID
        if node.tag == "!replace":
            if not isinstance(node, yaml.MappingNode):
                self.errors.add(self.file, line, path, "!replace takes a mapping")
                return INVALID
            node = yaml.MappingNode("tag:yaml.org,2002:map", node.value, node.start_mark)
            return Replace(self.value(node, path, depth))
        if node.tag not in _PLAIN_TAGS:
            self.errors.add(
                self.file,
                line,
                path,
                f"unknown tag {node.tag}; valid tags: !ref, !late, !call, !replace",
            )
            return INVALID
        if isinstance(node, yaml.SequenceNode):
            return [
                self.value(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(node.value)
            ]
        if isinstance(node, yaml.MappingNode):
            return {
                key: self.value(v, f"{path}.{key}", depth + 1)
                for key, _, v in self.items(node, path)
            }
        try:
            value = self.constructor.construct_object(node)
        except yaml.YAMLError as exc:
            self.errors.add(self.file, line, path, f"bad value: {exc}")
            return INVALID
        if isinstance(value, str) and "$" in value:
            return self.interpolate(value, line, path)
        return value

    def interpolate(self, text: str, line: int, path: str) -> str | _Invalid:
        """``text`` with ``${NAME}`` / ``${NAME:-default}`` from the environment and ``$$`` as
        ``$``; ``INVALID`` (reported) when a variable is unset and has no default."""
        unset = []

        def replace(match: re.Match) -> str:
            if match.group(0) == "$$":
                return "$"
            name, default = match.group(1), match.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            unset.append(name)
            self.errors.add(
                self.file,
                line,
                path,
                f"environment variable {name} is not set and has no default; set it or "
                f"write ${{{name}:-default}}",
            )
            return ""

        result = _ENV.sub(replace, text)
        return INVALID if unset else EnvStr(result)


def compose_file(
    path: Path, errors: Problems, overlay: bool
) -> tuple[yaml.Node | None, DocumentReader]:
    """The YAML node tree of the wiring file ``path`` (None if it cannot be read; the problem
    goes to ``errors``) and the reader that turns it into values."""
    file = str(path)
    reader = DocumentReader(file, errors, overlay)
    try:
        kind = os.stat(path)
        if not stat.S_ISREG(kind.st_mode):
            errors.add(file, None, "", "not a regular file (a device, a pipe or a directory)")
            return None, reader
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        errors.add(file, None, "", f"cannot read wiring file: {exc.strerror}")
        return None, reader
    if len(raw) > MAX_FILE_BYTES:
        errors.add(
            file, None, "", f"{kind.st_size} bytes, larger than a wiring may be ({MAX_FILE_BYTES})"
        )
        return None, reader
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        errors.add(
            file, line, "", f"not UTF-8 text (byte {raw[exc.start]:#04x}); save the file as UTF-8"
        )
        return None, reader
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader), reader
    except RecursionError:
        errors.add(file, None, "", f"values nest more than {MAX_DEPTH} levels deep")
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        errors.add(file, mark.line + 1 if mark else None, "", f"YAML syntax error: {problem}")
    except yaml.YAMLError as exc:
        errors.add(file, None, "", f"YAML error: {exc}")
    return None, reader


class Replace(dict):
    """A mapping tagged ``!replace`` in an overlay: it replaces what earlier files gave instead
    of merging into it."""


class WiringDumper(yaml.SafeDumper):
    """A YAML dumper that writes ``Ref``s back as ``!ref``/``!late``/``!call`` tags."""


WiringDumper.add_representer(
    Ref, lambda d, r: d.represent_scalar(f"!{r.kind}", ".".join((r.target, *r.attrs)))
)
WiringDumper.add_representer(EnvStr, lambda d, text: d.represent_str(str(text)))
WiringDumper.add_representer(Replace, lambda d, m: d.represent_mapping("!replace", dict(m)))


def compose_mapping(mapping: Mapping, errors: Problems) -> yaml.Node | None:
    """The YAML node tree of a wiring given as a mapping (None if it holds a value a wiring
    cannot; the problem goes to ``errors``)."""
    try:
        text = yaml.dump(dict(mapping), Dumper=WiringDumper, sort_keys=False)
    except yaml.representer.RepresenterError as exc:
        errors.add("<mapping>", None, "", f"the mapping holds a value a wiring cannot: {exc}")
        return None
    return yaml.compose(text, Loader=yaml.SafeLoader)
