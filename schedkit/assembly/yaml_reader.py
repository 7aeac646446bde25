"""Reading wiring YAML (files or mappings) into a ``Wiring``: values and ``Ref``s with the
file and line of every component, type and argument, overlays merged in order.

(Longer than 300 lines: one reader walks a document with its bounds, keys and lines; the
merge rules need the same reader.)

Reading is bounded and strict: a file that is not a regular file (a device such as /dev/zero,
a pipe) or is larger than ``MAX_FILE_BYTES`` is refused before it is read; a document that
expands past ``MAX_VALUES`` values or nests deeper than ``MAX_DEPTH`` is refused, and so are
non-UTF-8 bytes, duplicate keys, keys that are not plain names and tags other than ``!ref``,
``!late``, ``!call`` and ``!replace``; every problem is kept as
``FILE:LINE: path: problem`` for ``load_wiring`` to report together.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from schedkit.assembly.wiring import (
    _NAME,
    INVALID,
    ComponentSpec,
    EnvStr,
    Ref,
    Wiring,
    _Invalid,
    _make_ref,
)

__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "MAX_VALUES", "Replace", "WiringDumper", "read_wiring"]

_ENV = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_TOP_KEYS = ("plugins", "components")
_ENTRY_KEYS = ("type", "args")
# Bounds on what reading one wiring may cost: a file of a few hundred bytes whose aliases
# expand to billions of values, or nesting that exhausts the stack, is refused.
MAX_VALUES = 100_000
MAX_DEPTH = 50
MAX_FILE_BYTES = 1 << 20  # the shipped wiring is ~10 KB
_PLAIN_TAGS = frozenset(
    f"tag:yaml.org,2002:{t}"
    for t in ("str", "int", "float", "bool", "null", "seq", "map", "timestamp")
)


class _TooLarge(Exception):
    """Reading stopped: the document expands past ``MAX_VALUES`` values or ``MAX_DEPTH``."""

    def __init__(self, line: int, problem: str) -> None:
        self.line = line
        self.problem = problem


class _Errors(list):
    def add(self, file: str, line: int | None, path: str, message: str) -> None:
        where = file if line is None or file == "<mapping>" else f"{file}:{line}"
        self.append(f"{where}: {path}: {message}" if path else f"{where}: {message}")


class _FileReader:
    """Turns one YAML document into plain values and ``Ref``s, remembering lines."""

    def __init__(self, file: str, errors: _Errors, overlay: bool = False) -> None:
        self.file = file
        self.errors = errors
        self.overlay = overlay  # merged over earlier sources: a null argument removes the key
        self.constructor = yaml.constructor.SafeConstructor()
        self.values_read = 0

    def count(self, node: yaml.Node, depth: int) -> None:
        """Count one value read; stop reading a document that is too large or too deep."""
        self.values_read += 1
        if self.values_read > MAX_VALUES:
            raise _TooLarge(
                node.start_mark.line + 1,
                f"the document expands to more than {MAX_VALUES} values (aliases?); "
                "write it out plainly",
            )
        if depth > MAX_DEPTH:
            raise _TooLarge(
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


def _read_file(path: Path, errors: _Errors, overlay: bool) -> tuple[yaml.Node | None, _FileReader]:
    file = str(path)
    reader = _FileReader(file, errors, overlay)
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


def _merge_file(wiring: Wiring, root: yaml.Node | None, reader: _FileReader) -> None:
    try:
        _merge_document(wiring, root, reader)
    except _TooLarge as exc:
        reader.errors.add(reader.file, exc.line, "", exc.problem)
    except RecursionError:
        reader.errors.add(reader.file, None, "", f"values nest more than {MAX_DEPTH} levels deep")


def _merge_document(wiring: Wiring, root: yaml.Node | None, reader: _FileReader) -> None:
    file, errors = reader.file, reader.errors
    if root is None:
        return
    if not isinstance(root, yaml.MappingNode):
        errors.add(
            file,
            root.start_mark.line + 1,
            "",
            "a wiring file is a mapping with the keys 'plugins' and 'components'",
        )
        return
    for key, line, value_node in reader.items(root, ""):
        if key == "plugins":
            plugins = reader.value(value_node, "plugins")
            if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
                errors.add(file, line, "plugins", "expected a list of module names")
                continue
            wiring.plugins += [(p, file, line) for p in plugins]
        elif key == "components":
            if not isinstance(value_node, yaml.MappingNode):
                errors.add(
                    file, line, "components", "expected a mapping of component name -> {type, args}"
                )
                continue
            for name, name_line, entry_node in reader.items(value_node, "components"):
                _merge_entry(wiring, name, name_line, entry_node, reader)
        else:
            valid = ", ".join(_TOP_KEYS)
            errors.add(file, line, key, f"unknown top-level key; valid keys: {valid}")


def _merge_entry(
    wiring: Wiring, name: str, line: int, entry_node: yaml.Node, reader: _FileReader
) -> None:
    file, errors = reader.file, reader.errors
    path = f"components.{name}"
    if not _NAME.match(name) or name.startswith("_"):
        errors.add(
            file,
            line,
            path,
            "a component name is a Python identifier (letters, digits, underscores) that does "
            "not start with an underscore",
        )
        return
    if isinstance(entry_node, yaml.ScalarNode) and entry_node.tag == "tag:yaml.org,2002:null":
        wiring.components.pop(name, None)  # an overlay removes the component
        return
    replace = entry_node.tag == "!replace"
    if not isinstance(entry_node, yaml.MappingNode):
        errors.add(file, line, path, "expected a mapping with the keys 'type' and 'args'")
        return
    spec = wiring.components.get(name)
    if replace:
        spec = None  # the entry starts afresh: nothing of earlier files' entry is kept
    removes_nulls = reader.overlay and spec is not None
    if spec is None:
        spec = ComponentSpec(name, None, {}, file, line, (file, line), {})
        wiring.components[name] = spec
        if reader.overlay and not replace:
            spec.created_by_overlay = True
    for key, key_line, value_node in reader.items(entry_node, path):
        if key == "type":
            value = reader.value(value_node, f"{path}.type")
            if not isinstance(value, str) or not value:
                errors.add(
                    file,
                    key_line,
                    f"{path}.type",
                    "expected a registered component name or 'package.module:ClassName'",
                )
                continue
            spec.type, spec.type_loc = value, (file, key_line)
        elif key == "args":
            if isinstance(value_node, yaml.ScalarNode) and value_node.value in ("", "null", "~"):
                continue
            if not isinstance(value_node, yaml.MappingNode):
                errors.add(
                    file, key_line, f"{path}.args", "expected a mapping of argument name -> value"
                )
                continue
            for arg, arg_line, arg_value_node in reader.items(value_node, f"{path}.args"):
                value = reader.value(arg_value_node, f"{path}.args.{arg}")
                if removes_nulls and arg_value_node.tag == "tag:yaml.org,2002:null":
                    spec.args.pop(arg, None)  # an overlay's null removes the argument
                    _forget_locations(spec.arg_locs, arg)
                    continue
                old = spec.args.get(arg)
                if isinstance(old, dict) and type(value) is dict:
                    spec.args[arg] = _deep_merge(old, value, arg, arg_value_node, spec, file)
                else:
                    _forget_locations(spec.arg_locs, arg)
                    spec.args[arg] = _plain_mappings(value)
                    _record_locations(spec.arg_locs, arg, arg_value_node, file)
                spec.arg_locs[arg] = (file, arg_line)
        else:
            errors.add(
                file,
                key_line,
                f"{path}.{key}",
                f"unknown key; valid keys: {', '.join(_ENTRY_KEYS)}",
            )


class Replace(dict):
    """A mapping tagged ``!replace`` in an overlay: it replaces what earlier files gave instead
    of merging into it."""


def _plain_mappings(value: Any) -> Any:
    """``value`` with every ``Replace`` marker turned into a plain dict."""
    if isinstance(value, dict):
        return {k: _plain_mappings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_mappings(v) for v in value]
    return value


def _deep_merge(
    old: dict, new: dict, path: str, node: yaml.Node, spec: ComponentSpec, file: str
) -> dict:
    """``new`` merged into ``old`` key by key, nested mappings too (a ``Replace`` mapping, a
    list or a scalar replaces); the file and line of each key set go to ``spec.arg_locs``."""
    merged = dict(old)
    lines = _key_nodes(node)
    for key, value in new.items():
        key_path = f"{path}.{key}"
        key_line, value_node = lines.get(key, (None, None))
        if isinstance(merged.get(key), dict) and type(value) is dict and value_node is not None:
            merged[key] = _deep_merge(merged[key], value, key_path, value_node, spec, file)
        else:
            _forget_locations(spec.arg_locs, key_path)
            merged[key] = _plain_mappings(value)
            if value_node is not None:
                _record_locations(spec.arg_locs, key_path, value_node, file)
        spec.arg_locs[key_path] = (file, key_line)
    return merged


def _key_nodes(node: yaml.Node) -> dict[str, tuple[int, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {
        str(k.value): (k.start_mark.line + 1, v)
        for k, v in node.value
        if isinstance(k, yaml.ScalarNode)
    }


def _record_locations(
    locs: dict[str, tuple[str, int | None]], path: str, node: yaml.Node, file: str
) -> None:
    """The file and line of every key nested in ``node`` (a new value under ``path``)."""
    for key, (line, value_node) in _key_nodes(node).items():
        locs[f"{path}.{key}"] = (file, line)
        _record_locations(locs, f"{path}.{key}", value_node, file)


def _forget_locations(locs: dict[str, tuple[str, int | None]], path: str) -> None:
    for key in [k for k in locs if k == path or k.startswith(f"{path}.")]:
        del locs[key]


class WiringDumper(yaml.SafeDumper):
    """A YAML dumper that writes ``Ref``s back as ``!ref``/``!late``/``!call`` tags."""


WiringDumper.add_representer(
    Ref, lambda d, r: d.represent_scalar(f"!{r.kind}", ".".join((r.target, *r.attrs)))
)
WiringDumper.add_representer(EnvStr, lambda d, text: d.represent_str(str(text)))
WiringDumper.add_representer(Replace, lambda d, m: d.represent_mapping("!replace", dict(m)))


def _compose_mapping(mapping: Mapping, errors: _Errors) -> yaml.Node | None:
    try:
        text = yaml.dump(dict(mapping), Dumper=WiringDumper, sort_keys=False)
    except yaml.representer.RepresenterError as exc:
        errors.add("<mapping>", None, "", f"the mapping holds a value a wiring cannot: {exc}")
        return None
    return yaml.compose(text, Loader=yaml.SafeLoader)


def read_wiring(
    source: str | os.PathLike | Mapping,
    *overlays: str | os.PathLike | Mapping,
    errors: list[str] | None = None,
) -> Wiring:
    """Read and merge ``source`` and ``overlays`` without validating; problems go to ``errors``."""
    found = _Errors()
    wiring = Wiring({}, [], [])
    for position, item in enumerate((source, *overlays)):
        overlay = position > 0
        if isinstance(item, Mapping):
            wiring.sources.append("<mapping>")
            reader = _FileReader("<mapping>", found, overlay)
            _merge_file(wiring, _compose_mapping(item, found), reader)
        else:
            path = Path(item)
            wiring.sources.append(str(path))
            root, reader = _read_file(path, found, overlay)
            _merge_file(wiring, root, reader)
    for spec in wiring.components.values():
        if spec.type is None:
            others = [n for n, o in wiring.components.items() if o.type is not None]
            close = difflib.get_close_matches(spec.name, others, n=1, cutoff=0.6)
            if spec.created_by_overlay and close:
                problem = (
                    f"no component {spec.name!r} in the wiring to adjust, and no 'type' to "
                    f"create one; did you mean {close[0]}?"
                )
            elif spec.created_by_overlay:
                problem = (
                    f"no component {spec.name!r} in the wiring to adjust, and no 'type' to "
                    f"create one; components: {', '.join(others)}"
                )
            else:
                problem = "no 'type' given; name a registered component or 'package.module:Class'"
            found.add(spec.file, spec.line, f"components.{spec.name}", problem)
    if errors is not None:
        errors.extend(found)
    return wiring
