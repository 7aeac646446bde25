"""Argument parsing shared by the ``schedkit`` sub-commands: the wiring file with its overlays
and model / GPU presets, numbers that refuse what would make no sense (NaN, a negative
count, infinity where a finite value is needed) with a message that says what is valid, and
the listing of every problem found in an input."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from schedkit import wirings
from schedkit.assembly.loading import load_wiring
from schedkit.assembly.wiring import Wiring, WiringError
from schedkit.runner import presets
from schedkit.workloads.workload import CHAT_RATE

__all__ = [
    "add_wiring_args",
    "number",
    "print_problems",
    "run_provenance",
    "wiring_from_args",
    "wiring_sources",
]


def _preset_name(lookup: Callable[[str], Any]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            lookup(text)
        except presets.PresetError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return parse


def _shipped_overlays() -> list[str]:
    return [name for name in wirings.names() if name != wirings.DEFAULT]


def _overlay(text: str) -> str:
    """An overlay file, or the file of a shipped overlay named ``text`` (``-o serve``)."""
    if text in _shipped_overlays() and not Path(text).exists():
        return str(wirings.path(text))
    return text


def add_wiring_args(parser: argparse.ArgumentParser) -> None:
    """The wiring file (the built-in default when left out), the repeatable ``-o/--overlay``
    and the ``--model`` / ``--gpu`` / ``--tp`` presets."""
    parser.add_argument(
        "file",
        nargs="?",
        metavar="FILE",
        help="wiring YAML file (default: the built-in wiring that `schedkit init` writes)",
    )
    parser.add_argument(
        "-o",
        "--overlay",
        action="append",
        type=_overlay,
        default=[],
        metavar="OVERLAY",
        help="overlay YAML merged over FILE (repeatable, applied in order); a name with no "
        f"such file is a shipped overlay: {', '.join(_shipped_overlays())}",
    )
    group = parser.add_argument_group(
        "presets", "set the simulated model runner's costs and the KV pool from a model and a GPU"
    )
    group.add_argument(
        "--model",
        type=_preset_name(presets.model),
        help=f"{', '.join(presets.MODELS)} (default with --gpu/--tp/--model-limits: llama3-8b)",
    )
    group.add_argument(
        "--gpu",
        type=_preset_name(presets.gpu),
        help=f"{', '.join(presets.GPUS)} (default with --model/--tp/--model-limits: h100)",
    )
    group.add_argument(
        "--tp",
        type=number(int),
        help="tensor-parallel GPUs (default: the model's, 4 for llama3-70b, else 1)",
    )
    group.add_argument(
        "--model-limits",
        choices=presets.MODEL_LIMITS,
        default="off",
        help="refuse on arrival, as SGLang does, prompts of the model's context length or more "
        "and token ids outside its vocabulary (refuse), or cut such prompts (truncate); off "
        "(default): trace replays keep their long prompts (docs/running.md)",
    )


def _preset_asked(args: argparse.Namespace) -> bool:
    return bool(args.model or args.gpu or args.tp or args.model_limits != "off")


def wiring_sources(
    args: argparse.Namespace, *, announce: bool = True
) -> tuple[str | Path, list[str | Path | Mapping]]:
    """The wiring file and the overlays (the preset's, if any, then ``-o`` ones) that
    ``add_wiring_args`` options name, for a command that loads the wiring more than once;
    ``announce`` prints the preset's figures."""
    file = args.file or wirings.path()
    if not _preset_asked(args):
        return file, list(args.overlay)
    try:
        preset, line = presets.preset_overlay(
            load_wiring(file, *args.overlay), args.model, args.gpu, args.tp, args.model_limits
        )
    except presets.PresetError as exc:
        raise WiringError(f"--model/--gpu/--tp: {exc}") from None
    if announce:
        print(f"schedkit: preset {line}", file=sys.stderr)
    return file, [preset, *args.overlay]


def run_provenance(args: argparse.Namespace) -> dict[str, Any]:
    """What produced a run's figures, for its ``--json`` object: the schedkit version, the
    wiring and overlay files, the preset, and the workload options."""
    from schedkit import __version__

    preset = None
    if _preset_asked(args):
        preset = {
            "model": args.model,
            "gpu": args.gpu,
            "tp": args.tp,
            "model_limits": args.model_limits,
        }
    provenance = {
        "schedkit_version": __version__,
        "wiring": str(args.file or wirings.path()),
        "overlays": [str(o) for o in args.overlay],
        "preset": preset,
    }
    if hasattr(args, "seed"):
        rate = args.rate
        if rate is None and not args.workload and args.synthetic == "chat":
            rate = CHAT_RATE  # the chat workload's own default
        provenance.update(
            workload=args.workload or f"synthetic:{args.synthetic}",
            format=args.format,
            num_requests=args.num_requests or (None if args.workload else 400),
            rate="inf" if rate == math.inf else rate,  # null: all at once / the trace's times
            seed=args.seed,
            speedup=args.speedup,
        )
    return provenance


def wiring_from_args(args: argparse.Namespace, *extra: Mapping) -> Wiring:
    """Load the wiring that ``add_wiring_args`` options name: the file, then the preset's
    overlay (if any), then ``-o`` overlays (which may adjust a preset), then ``extra``."""
    # A reload with a command's own adjustments says the preset line only once.
    file, overlays = wiring_sources(args, announce=not extra)
    return load_wiring(file, *overlays, *extra)


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


def print_problems(command: str, errors: list[str], where: str = "") -> None:
    """``schedkit COMMAND: N problem(s)[ where]:`` on stderr, then each error indented."""
    print(f"schedkit {command}: {len(errors)} problem(s){where}:", file=sys.stderr)
    for error in errors:
        print(f"  {error}", file=sys.stderr)
