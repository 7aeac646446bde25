"""``schedkit init``: write the default wiring (or a shipped example overlay) to start from."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from schedkit import wirings

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
    if target.exists() and not args.force:
        print(f"schedkit init: {target} exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    target.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    if args.example:
        print(
            f"schedkit init: wrote the {args.example} overlay to {target}; use it over a wiring: "
            f"schedkit run wiring.yaml -o {target}",
            file=sys.stderr,
        )
    else:
        print(f"schedkit init: wrote the default wiring to {target}", file=sys.stderr)
    return 0
