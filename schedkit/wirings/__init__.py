"""The wirings that ship with schedkit: ``wiring`` (the default scheduler, the repository's
``wiring.yaml``) and the examples' overlays ``serve`` and ``swa`` (``examples/serve.yaml``,
``examples/swa.yaml``).

In the source tree each file here is a symbolic link to the documented file, so there is one
copy to edit; a built wheel holds the files themselves (``tests/test_packaging.py`` checks).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT", "default_source", "names", "path"]

DEFAULT = "wiring"
_HERE = Path(__file__).parent


def names() -> list[str]:
    """The names of the shipped wirings (``wiring``, ``serve``, ``swa``, ...)."""
    return sorted(p.stem for p in _HERE.glob("*.yaml"))


def path(name: str = DEFAULT) -> Path:
    """The file of the shipped wiring ``name``; ``ValueError`` naming the valid ones."""
    if name not in names():
        raise ValueError(f"no shipped wiring {name!r}; valid names: {', '.join(names())}")
    return _HERE / f"{name}.yaml"


def default_source(*roots: str | Path) -> Path:
    """The wiring to use when none is named: ``wiring.yaml`` in the working directory (or in
    one of ``roots``, such as a pytest root directory), else the shipped default wiring."""
    for root in (Path(), *map(Path, roots)):
        candidate = root / "wiring.yaml"
        if candidate.is_file():
            return candidate
    return path(DEFAULT)
