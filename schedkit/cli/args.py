"""Argument parsing shared by the ``schedkit`` sub-commands: the wiring file with its overlays,
and numbers that refuse what would make no sense (NaN, a negative count, infinity where a
finite value is needed) with a message that says what is valid."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

__all__ = ["add_wiring_args", "number"]


def add_wiring_args(parser: argparse.ArgumentParser) -> None:
    """The positional wiring file and the repeatable ``-o/--overlay``."""
    parser.add_argument("file", help="wiring YAML file")
    parser.add_argument(
        "-o",
        "--overlay",
        action="append",
        default=[],
        metavar="OVERLAY",
        help="overlay YAML merged over FILE (repeatable, applied in order)",
    )


def number(
    kind: type, *, minimum: float = 0, allow_minimum: bool = False, allow_inf: bool = False
) -> Callable[[str], Any]:
    """An argparse ``type`` for an ``int`` or ``float`` above ``minimum`` (or equal to it with
    ``allow_minimum``); NaN is always refused, infinity unless ``allow_inf``."""
    bound = f">= {minimum}" if allow_minimum else f"> {minimum}"
    valid = f"a {'number' if kind is float else 'whole number'} {bound}"
    if allow_inf:
        valid += " or inf"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {valid}, got {text!r}") from None
        if math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0)):
            raise argparse.ArgumentTypeError(f"expected {valid}, got {text!r}")
        if value < minimum or (value == minimum and not allow_minimum):
            raise argparse.ArgumentTypeError(f"expected {valid}, got {text!r}")
        return value

    return parse
