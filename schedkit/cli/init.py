"""``schedkit init``: write the default wiring (or a shipped example overlay) to start from."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from schedkit import wirings
from schedkit.cli.files import output_problem

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``init`` sub-command."""
    p = sub.add_parser("init", help="write the default wiring (or a shipped example) to a file")
    p.add_argument(
        "path",
        nargs="?",
        help="where (default: wiring.yaml, or NAME.yaml for --example NAME)",
    )
    p.add_argument(
        "--example",
        choices=[n for n in wirings.names() if n != wirings.DEFAULT],
        help="write this shipped overlay instead of the default wiring",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(run=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    """``schedkit init``: write the shipped wiring (or ``--example`` overlay) to the path."""
    source = wirings.path(args.example or wirings.DEFAULT)
    target = Path(args.path or f"{args.example or 'wiring'}.yaml")
    problem = output_problem(str(target), overwrite=args.force)
    if problem is not None:
        print(f"schedkit init: {problem}", file=sys.stderr)
        return 2
    try:
        target.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    except OSError as exc:
        print(f"schedkit init: cannot write {target}: {exc.strerror}", file=sys.stderr)
        return 2
    if args.example:
        print(
            f"schedkit init: wrote the {args.example} overlay to {target}; use it over a wiring: "
            f"schedkit run wiring.yaml -o {target}",
            file=sys.stderr,
        )
    else:
        print(f"schedkit init: wrote the default wiring to {target}", file=sys.stderr)
    return 0
