"""The ``schedkit`` command line: validate, graph and show wirings, and run, serve or spread
over a fleet the scheduler they assemble.

Wiring problems print as a list and exit with status 2, never with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import msgspec
import yaml

from schedkit.assembly.validate import iter_refs
from schedkit.assembly.wiring import Ref, Wiring, WiringError
from schedkit.assembly.yaml_values import WiringDumper
from schedkit.cli.args import add_wiring_args, print_problems, wiring_from_args
from schedkit.logs import logs_to_stderr

__all__ = ["main"]


def first_paragraph(doc: str) -> str:
    """A docstring's first paragraph as one line (a ``--help`` description)."""
    return " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "")


def _edges(wiring: Wiring) -> list[tuple[str, Ref]]:
    return [
        (name, r)
        for name, spec in wiring.components.items()
        for value in spec.args.values()
        for r in iter_refs(value)
    ]


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_validate(args: argparse.Namespace) -> int:
    wiring = wiring_from_args(args)
    edges = _edges(wiring)
    rows = [("component", "type", "eager (!ref)", "late (!late, !call)")]
    for name, spec in wiring.components.items():
        mine = [r for n, r in edges if n == name]
        eager = sorted({r.target for r in mine if r.eager})
        late = sorted({".".join((r.target, *r.attrs)) for r in mine if not r.eager})
        rows.append((name, spec.type or "", ", ".join(eager) or "-", ", ".join(late) or "-"))
    print(_table(rows))
    print(f"\n{wiring.sources[0]}: {len(wiring.components)} components, wiring is valid")
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    wiring = wiring_from_args(args)
    edges = _edges(wiring)
    if args.format == "dot":
        lines = ["digraph wiring {", "  rankdir=LR;"]
        lines += [f'  {n} [label="{n}\\n{s.type}"];' for n, s in wiring.components.items()]
        for name, r in edges:
            style = "solid" if r.eager else "dashed"
            label = ".".join(r.attrs) or r.kind
            lines.append(f'  {name} -> {r.target} [style={style}, label="{label}"];')
        lines.append("}")
    else:
        lines = ["flowchart LR"]
        lines += [f'  {n}["{n}<br/>{s.type}"]' for n, s in wiring.components.items()]
        for name, r in edges:
            label = ".".join(r.attrs) or r.kind
            arrow = f"-->|{label}|" if r.eager else f"-.->|{label}|"
            lines.append(f"  {name} {arrow} {r.target}")
    print("\n".join(lines))
    return 0


_UNWRITABLE = object()


def _plain(value: Any) -> Any:
    """``value`` as YAML-writable data, or ``_UNWRITABLE`` (a function, an object)."""
    if isinstance(value, Ref):
        return value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, str):  # an EnvStr (from ${...}) is written as the text it holds
        return str(value)
    if callable(value):
        return _UNWRITABLE
    try:
        return msgspec.to_builtins(value, enc_hook=_builtin)
    except TypeError:
        return _UNWRITABLE


def _builtin(value: Any) -> Any:
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def resolved_config(wiring: Wiring) -> dict[str, Any]:
    """Every component with every constructor field, defaults filled in, as plain data that
    loads as a wiring again. A default that is no plain value (a function, an object) is left
    out: left out, it is the default again."""
    components = {}
    for name, spec in wiring.components.items():
        args = {}
        for field in attrs.fields(spec.cls):
            if not field.init:
                continue
            if field.alias in spec.args:
                value = _plain(spec.args[field.alias])
            elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
                if field.default.takes_self:
                    continue
                value = _plain(field.default.factory())
            else:
                value = _plain(field.default)
            if value is not _UNWRITABLE:
                args[field.alias] = value
        components[name] = {"type": spec.type, "args": args}
    return {"components": components}


def explain(wiring: Wiring) -> str:
    """The merged wiring as YAML with, after every value, the file and line that set it."""
    lines = ["components:"]

    def where(spec: Any, key: str) -> str:
        if key not in spec.arg_locs:
            return "default"
        file, line = spec.arg_locs[key]
        return file if line is None else f"{file}:{line}"

    def emit(spec: Any, path: str, key: str, value: Any, indent: int) -> None:
        pad = " " * indent
        plain = _plain(value)
        if isinstance(plain, dict) and plain:
            lines.append(f"{pad}{key}:  # {where(spec, path)}")
            for k, v in plain.items():
                emit(spec, f"{path}.{k}", k, v, indent + 2)
            return
        if isinstance(plain, Ref):
            text = str(plain)
        else:
            text = "<not writable>" if plain is _UNWRITABLE else _flow(plain)
        lines.append(f"{pad}{key}: {text}  # {where(spec, path)}")

    for name, spec in wiring.components.items():
        lines.append(f"  {name}:  # {spec.where()}")
        lines.append(f"    type: {spec.type}  # {spec.where('type')}")
        if spec.args:
            lines.append("    args:")
            for key, value in spec.args.items():
                emit(spec, key, key, value, 6)
    return "\n".join(lines)


def _flow(value: Any) -> str:
    text = yaml.dump(value, Dumper=WiringDumper, default_flow_style=True, width=1 << 16)
    return text.strip().removesuffix("...").strip()


def cmd_config(args: argparse.Namespace) -> int:
    wiring = wiring_from_args(args)
    if args.explain:
        print(explain(wiring))
        return 0
    if args.resolved:
        data = resolved_config(wiring)
    else:
        data = {
            "components": {
                n: {"type": s.type, "args": _plain(s.args)} for n, s in wiring.components.items()
            }
        }
    if wiring.plugins:
        data = {"plugins": [p for p, _, _ in wiring.plugins], **data}
    print(yaml.dump(data, Dumper=WiringDumper, sort_keys=False, default_flow_style=False), end="")
    return 0


# The modules declaring the other sub-commands, in --help order, and the commands of each.
# A command imports only its own module (fleet, events and calibrate bring tens of
# milliseconds of imports each); --help, or no known command, imports them all.
_COMMAND_MODULES = {
    "run": ("run", "serve"),
    "events": ("events",),
    "init": ("init",),
    "calibrate": ("calibrate",),
    "fleet": ("fleet",),
}
_OWN_COMMANDS = ("validate", "graph", "config")


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``schedkit`` parser; with ``command``, only that sub-command of the modules'."""
    from schedkit import __version__

    parser = argparse.ArgumentParser(prog="schedkit", description=first_paragraph(__doc__))
    parser.add_argument("--version", action="version", version=f"schedkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check a wiring and list its components and edges")
    add_wiring_args(p)
    p.set_defaults(run=cmd_validate)
    p = sub.add_parser("graph", help="print the component graph (eager solid, late dashed)")
    add_wiring_args(p)
    p.add_argument("--format", choices=("mermaid", "dot"), default="mermaid")
    p.set_defaults(run=cmd_graph)
    p = sub.add_parser("config", help="print the configuration a wiring operates with")
    add_wiring_args(p)
    p.add_argument(
        "--resolved", action="store_true", help="every field of every component, defaults included"
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="the merged wiring with the file and line that set each value (base or overlay)",
    )
    p.set_defaults(run=cmd_config)
    known = command in _OWN_COMMANDS or any(command in c for c in _COMMAND_MODULES.values())
    for name, commands in _COMMAND_MODULES.items():
        if not known or command in commands:
            module = importlib.import_module(f"schedkit.cli.{name}")
            getattr(module, "add_parsers", getattr(module, "add_parser", None))(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``schedkit`` command."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = _parser(command).parse_args(argv)
    # Logs go to stderr while the command runs (schedkit.logs), the logging setup found before
    # restored after: main() called in-process leaves none of its own behind.
    with logs_to_stderr():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; wiring problems and unreadable files named on the command
    line exit with status 2."""
    try:
        return args.run(args)
    except BrokenPipeError:  # the reader went away (e.g. `schedkit graph ... | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except WiringError as exc:
        print_problems(args.command, exc.errors)
        return 2
    except OSError as exc:
        if exc.filename is None:  # not a file named on the command line
            raise
        print(f"schedkit {args.command}: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
