"""Fitting the simulated model runner's cost model to measured step times.

The steps come from a CSV file (``schedkit.runner.calibration_csv``).

Each mode is fitted by least squares with non-negative coefficients (a term whose best value
would be negative is left at 0 and named in the result), on the cost model's own terms::

    prefill: step_time - overhead = prefill_fixed + prefill_per_token * new_tokens
                                    + attention_coeff * attention_pairs
    decode:  step_time - overhead = decode_fixed + decode_per_seq * batch_size
                                    + decode_per_kv_token * context_tokens
    overhead = step_overhead + request_overhead * batch_size

The overhead terms are held at given values (0 unless told): one step's time cannot tell the
scheduler's per-step and per-request time from the fixed and per-request model terms, so
whatever is not held lands in ``*_fixed`` and ``decode_per_seq``. Pure Python: each fit solves
the normal equations of at most three terms, columns scaled to their largest value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs

__all__ = ["TERMS", "CalibrationError", "Fit", "ModeFit", "Step", "fit"]


class CalibrationError(ValueError):
    """The CSV could not be read or fitted; ``errors`` lists every problem."""

    def __init__(self, errors: list[str] | str) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("\n".join(self.errors))


@attrs.frozen(kw_only=True)
class Step:
    """One measured forward step."""

    mode: str
    batch_size: int
    new_tokens: int = 0
    attention_pairs: int = 0
    context_tokens: int = 0
    step_time: float  # seconds


TERMS: dict[str, tuple[tuple[str, Callable[[Step], float]], ...]] = {
    "prefill": (
        ("prefill_fixed", lambda s: 1.0),
        ("prefill_per_token", lambda s: s.new_tokens),
        ("attention_coeff", lambda s: s.attention_pairs),
    ),
    "decode": (
        ("decode_fixed", lambda s: 1.0),
        ("decode_per_seq", lambda s: s.batch_size),
        ("decode_per_kv_token", lambda s: s.context_tokens),
    ),
}
_VARYING = {"prefill": "new_tokens and attention_pairs", "decode": "batch_size and context_tokens"}


def _solve(columns: list[list[float]], y: list[float]) -> list[float] | None:
    """Least squares by the normal equations, columns scaled to their largest value; None
    when the columns are linearly dependent."""
    k = len(columns)
    scale = [max(abs(v) for v in col) or 1.0 for col in columns]
    cols = [[v / s for v in col] for col, s in zip(columns, scale, strict=True)]
    a = [[sum(p * q for p, q in zip(ci, cj, strict=True)) for cj in cols] for ci in cols]
    b = [sum(p * q for p, q in zip(ci, y, strict=True)) for ci in cols]
    size = max(abs(v) for row in a for v in row) or 1.0
    for i in range(k):  # Gaussian elimination with partial pivoting
        pivot = max(range(i, k), key=lambda r: abs(a[r][i]))
        if abs(a[pivot][i]) <= 1e-10 * size:
            return None
        a[i], a[pivot], b[i], b[pivot] = a[pivot], a[i], b[pivot], b[i]
        for r in range(i + 1, k):
            factor = a[r][i] / a[i][i]
            a[r] = [x - factor * z for x, z in zip(a[r], a[i], strict=True)]
            b[r] -= factor * b[i]
    x = [0.0] * k
    for i in reversed(range(k)):
        x[i] = (b[i] - sum(a[i][j] * x[j] for j in range(i + 1, k))) / a[i][i]
    return [v / s for v, s in zip(x, scale, strict=True)]


@attrs.frozen(kw_only=True)
class ModeFit:
    """One mode's fitted coefficients (seconds) and how well they reproduce its steps."""

    mode: str
    rows: int
    coefficients: dict[str, float]
    zeroed: tuple[str, ...]  # terms whose least-squares value was negative, left at 0
    rmse: float  # seconds
    max_error: float  # seconds
    mean_relative_error: float  # fraction of the measured step time


@attrs.frozen(kw_only=True)
class Fit:
    """The fitted modes and the overhead values held during the fit."""

    modes: dict[str, ModeFit]
    step_overhead: float
    request_overhead: float

    def runner_args(self) -> dict[str, float]:
        """The ``simulated_model_runner`` arguments that the fit sets."""
        args = {
            k: float(f"{v:.6g}") for m in self.modes.values() for k, v in m.coefficients.items()
        }
        return {
            **args,
            "step_overhead": self.step_overhead,
            "request_overhead": self.request_overhead,
        }

    def overlay(self, component: str = "model_runner") -> dict[str, Any]:
        """A wiring overlay giving ``component`` the fitted coefficients."""
        return {"components": {component: {"args": self.runner_args()}}}


def _fit_mode(mode: str, steps: Sequence[Step], overhead: Callable[[Step], float]) -> ModeFit:
    terms = TERMS[mode]
    names = [name for name, _ in terms]
    if len(steps) < len(terms):
        raise CalibrationError(f"{len(steps)} {mode} step(s); a fit needs at least {len(terms)}")
    columns = [[float(column(s)) for s in steps] for _, column in terms]
    y = [s.step_time - overhead(s) for s in steps]
    if _solve(columns, y) is None:
        raise CalibrationError(
            f"the {mode} steps cannot tell the terms {', '.join(names)} apart: "
            f"{_VARYING[mode]} must vary independently of each other across the steps"
        )
    best: tuple[float, dict[str, float]] | None = None
    for size in range(len(terms), 0, -1):
        for subset in itertools.combinations(range(len(terms)), size):
            x = _solve([columns[i] for i in subset], y)
            if x is None or min(x) < 0:
                continue
            coefficients = dict.fromkeys(names, 0.0)
            coefficients.update({names[i]: v for i, v in zip(subset, x, strict=True)})
            sse = sum(
                (yy - sum(coefficients[n] * col[r] for n, col in zip(names, columns, strict=True)))
                ** 2
                for r, yy in enumerate(y)
            )
            if best is None or sse < best[0]:
                best = (sse, coefficients)
    if best is None:
        raise CalibrationError(f"no non-negative fit of the {mode} steps")
    coefficients = best[1]
    errors = [
        sum(coefficients[n] * col[r] for n, col in zip(names, columns, strict=True)) - yy
        for r, yy in enumerate(y)
    ]
    return ModeFit(
        mode=mode,
        rows=len(steps),
        coefficients=coefficients,
        zeroed=tuple(n for n, v in coefficients.items() if v == 0.0),
        rmse=math.sqrt(sum(e * e for e in errors) / len(errors)),
        max_error=max(abs(e) for e in errors),
        mean_relative_error=sum(abs(e) / s.step_time for e, s in zip(errors, steps, strict=True))
        / len(steps),
    )


def fit(steps: Sequence[Step], step_overhead: float = 0.0, request_overhead: float = 0.0) -> Fit:
    """Fit each mode present in ``steps``, holding the overhead terms at the given seconds."""
    if step_overhead < 0 or request_overhead < 0:
        raise CalibrationError("the overhead terms must be >= 0 seconds")

    def overhead(s: Step) -> float:
        return step_overhead + request_overhead * s.batch_size

    modes = {}
    for mode in TERMS:
        mine = [s for s in steps if s.mode == mode]
        if mine:
            modes[mode] = _fit_mode(mode, mine, overhead)
    return Fit(modes=modes, step_overhead=step_overhead, request_overhead=request_overhead)
