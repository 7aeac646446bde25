"""Loading a wiring: read the YAML files (or mappings), merge the overlays, validate."""

from __future__ import annotations

import os
from collections.abc import Mapping

from schedkit.assembly.validate import validate
from schedkit.assembly.wiring import Wiring, WiringError
from schedkit.assembly.yaml_reader import read_wiring

__all__ = ["load_wiring"]


def load_wiring(
    source: str | os.PathLike | Mapping, *overlays: str | os.PathLike | Mapping
) -> Wiring:
    """Load a wiring file (or mapping), merge ``overlays`` over it in order, and validate it.

    Raises ``WiringError`` listing every problem, each as ``FILE:LINE: path: problem; fix``.
    """
    errors: list[str] = []
    wiring = read_wiring(source, *overlays, errors=errors)
    errors += validate(wiring)
    if errors:
        raise WiringError(sorted(errors, key=_location))
    return wiring


def _location(error: str) -> tuple[str, int]:
    file, _, rest = error.partition(":")
    line = rest.split(":", 1)[0]
    return (file, int(line) if line.isdigit() else 0)
