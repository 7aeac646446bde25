"""Wiring YAML read into values within its bounds: alias expansion, nesting and encoding are
refused as FILE:LINE problems, quickly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from schedkit import WiringError, load_wiring

BILLION_LAUGHS = """\
components:
  a:
    type: parallel_state
    args:
      x0: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
      x1: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
      x2: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
      x3: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
      x4: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
      x5: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
      x6: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
      x7: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
      x8: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def problems(path: Path) -> list[str]:
    with pytest.raises(WiringError) as exc:
        load_wiring(path)
    return exc.value.errors


def test_alias_expansion_is_cut_short(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(BILLION_LAUGHS)
    start = time.monotonic()
    errors = problems(path)
    assert time.monotonic() - start < 5
    assert any(f"{path}:" in e and "expands to more than 100000 values" in e for e in errors)


@pytest.mark.parametrize("depth", [60, 5000])
def test_deep_nesting_is_refused(tmp_path, depth):
    path = tmp_path / "deep.yaml"
    path.write_text(
        "components:\n  a:\n    type: parallel_state\n    args:\n      x: "
        + "[" * depth
        + "]" * depth
        + "\n"
    )
    (error,) = problems(path)
    assert error.startswith(str(path)) and "nest" in error and "levels deep" in error


def test_non_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"components:\n  a:\n    type: parallel_state # caf\xe9\n")
    assert problems(path) == [f"{path}:3: not UTF-8 text (byte 0xe9); save the file as UTF-8"]
