"""Reading wiring YAML (files or mappings) into a ``Wiring``: the wiring document's keys
(``plugins``, ``components``, each entry's ``type`` and ``args``) with the file and line of
every component, type and argument, overlays merged in order.

Each source is read into values by ``yaml_values`` (bounded and strict, see there); every
problem is kept as ``FILE:LINE: path: problem`` for ``load_wiring`` to report together.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from schedkit.assembly.wiring import _NAME, ComponentSpec, Wiring
from schedkit.assembly.yaml_values import (
    MAX_DEPTH,
    DocumentReader,
    Problems,
    Replace,
    TooLarge,
    compose_file,
    compose_mapping,
)

__all__ = ["Replace", "read_wiring"]

_TOP_KEYS = ("plugins", "components")
_ENTRY_KEYS = ("type", "args")


def _merge_file(wiring: Wiring, root: yaml.Node | None, reader: DocumentReader) -> None:
    try:
        _merge_document(wiring, root, reader)
    except TooLarge as exc:
        reader.errors.add(reader.file, exc.line, "", exc.problem)
    except RecursionError:
        reader.errors.add(reader.file, None, "", f"values nest more than {MAX_DEPTH} levels deep")


def _merge_document(wiring: Wiring, root: yaml.Node | None, reader: DocumentReader) -> None:
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
            if not reader.plain_mapping(value_node, "components"):
                continue
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
    wiring: Wiring, name: str, line: int, entry_node: yaml.Node, reader: DocumentReader
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
        if not reader.overlay:
            errors.add(
                file,
                line,
                path,
                "an empty entry; give {type: ..., args: ...} (an empty entry removes a "
                "component only in an overlay)",
            )
            return
        wiring.components.pop(name, None)  # an overlay removes the component
        return
    replace = entry_node.tag == "!replace"
    if not replace and not reader.plain_mapping(entry_node, path):
        return
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
            if not reader.plain_mapping(value_node, f"{path}.args"):
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


def read_wiring(
    source: str | os.PathLike | Mapping,
    *overlays: str | os.PathLike | Mapping,
    errors: list[str] | None = None,
) -> Wiring:
    """Read and merge ``source`` and ``overlays`` without validating; problems go to ``errors``."""
    found = Problems()
    wiring = Wiring({}, [], [])
    for position, item in enumerate((source, *overlays)):
        overlay = position > 0
        if isinstance(item, Mapping):
            wiring.sources.append("<mapping>")
            reader = DocumentReader("<mapping>", found, overlay)
            _merge_file(wiring, compose_mapping(item, found), reader)
        else:
            path = Path(item)
            wiring.sources.append(str(path))
            root, reader = compose_file(path, found, overlay)
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
