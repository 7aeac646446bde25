"""``schedkit calibrate``: fit the simulated runner's cost model to measured step times and
print the coefficients, the fit's error and the overlay that uses them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from schedkit.assembly.yaml_values import WiringDumper
from schedkit.cli.args import number, print_problems
from schedkit.cli.files import output_problem
from schedkit.runner.calibrate import TERMS, CalibrationError, fit
from schedkit.runner.calibration_csv import COLUMNS, read_steps

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` sub-command."""
    p = sub.add_parser(
        "calibrate",
        help="fit the simulated runner's cost model to measured step times (CSV)",
        description=f"CSV columns: {', '.join(COLUMNS)} (see schedkit/runner/calibration_csv.py)",
    )
    p.add_argument("csv", metavar="FILE.csv", help="one measured forward step per line")
    p.add_argument(
        "--step-overhead-us",
        type=number(float, allow_minimum=True),
        default=0.0,
        help="scheduler time per step held during the fit, in microseconds (default 0)",
    )
    p.add_argument(
        "--request-overhead-us",
        type=number(float, allow_minimum=True),
        default=0.0,
        help="scheduler time per request in a step held during the fit, in us (default 0)",
    )
    p.add_argument(
        "--component",
        default="model_runner",
        help="the simulated runner's name in the wiring (default: model_runner)",
    )
    p.add_argument("--write", metavar="OVERLAY.yaml", help="also write the overlay to this file")
    p.add_argument("--force", action="store_true", help="let --write overwrite an existing file")
    p.set_defaults(run=cmd_calibrate)


def _seconds(value: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value / 1e-12:.4g} ps" if value else "0"


_PER = {
    "prefill_per_token": "per new token",
    "attention_coeff": "per (new token, context token) pair",
    "decode_per_seq": "per request",
    "decode_per_kv_token": "per context token",
}


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``schedkit calibrate``: print (and with ``--write`` save) the fitted overlay; 2 when
    the CSV cannot be read or fitted, or the ``--write`` file cannot be written."""
    if args.write:
        problem = output_problem(args.write, overwrite=args.force)
        if problem is not None:
            print(f"schedkit calibrate: {problem}", file=sys.stderr)
            return 2
    try:
        result = fit(
            read_steps(args.csv),
            step_overhead=args.step_overhead_us / 1e6,
            request_overhead=args.request_overhead_us / 1e6,
        )
    except CalibrationError as exc:
        print_problems("calibrate", exc.errors)
        return 2
    for mode in TERMS:
        m = result.modes.get(mode)
        if m is None:
            print(f"{mode}: no steps; its coefficients are left as the wiring has them\n")
            continue
        print(f"{mode}: {m.rows} steps")
        for name, value in m.coefficients.items():
            print(f"  {name:<20} {_seconds(value):>10}  {_PER.get(name, '')}".rstrip())
        print(
            f"  fit: RMSE {m.rmse * 1e3:.3f} ms, mean error {m.mean_relative_error:.1%}, "
            f"max {m.max_error * 1e3:.3f} ms"
        )
        if m.zeroed:
            print(f"  left at 0 (a negative value fits best): {', '.join(m.zeroed)}")
        print()
    print(
        f"held: step_overhead {_seconds(result.step_overhead)}, "
        f"request_overhead {_seconds(result.request_overhead)}\n"
    )
    overlay = result.overlay(args.component)
    text = yaml.dump(overlay, Dumper=WiringDumper, sort_keys=False)
    usage = args.write or "OVERLAY.yaml"
    print(f"# overlay: schedkit run wiring.yaml -o {usage}\n{text}", end="")
    if args.write:
        try:
            Path(args.write).write_text(
                f"# Fitted by `schedkit calibrate {args.csv}`\n{text}", encoding="utf-8"
            )
        except OSError as exc:
            print(f"schedkit calibrate: cannot write {args.write}: {exc.strerror}", file=sys.stderr)
            return 2
    return 0
