"""docs/architecture.md matches the code: every file, function, wiring key and protocol its
tables name exists, and each key leads to a component of the class whose method the row names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import schedkit.core.protocols as protocols
from schedkit import Ref, load_wiring

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
COLUMNS = ["#", "what happens", "file", "function", "wiring key", "protocol"]


def _rows() -> list[dict[str, str]]:
    rows, header = [], None
    for line in DOC.read_text().splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
        elif set(cells[0]) != {"-"}:
            assert header == COLUMNS, header
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


ROWS = _rows()


def _defines(path: Path, function: str) -> bool:
    tree = ast.parse(path.read_text())
    owner, _, name = function.rpartition(".")
    scopes = [tree]
    if owner:
        scopes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
    return any(
        isinstance(n, ast.FunctionDef) and n.name == name for scope in scopes for n in scope.body
    )


def _module(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    return ".".join(["schedkit", *parts] if parts[0] == "components" else parts)


def _component_class(wiring, key: str) -> type:
    name, _, arg = key.partition(".")
    spec = wiring.components[name]
    if not arg:
        return spec.cls
    value = spec.args[arg]
    assert isinstance(value, Ref), f"{key} is not a reference"
    return wiring.components[value.target].cls


def test_the_tables_have_rows():
    assert len(ROWS) >= 20


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['file']}:{r['function']}")
def test_each_hop_exists_in_the_code(row):
    wiring = load_wiring(ROOT / "wiring.yaml", ROOT / "examples" / "serve.yaml")
    path = ROOT / row["file"]
    assert path.is_file()
    assert _defines(path, row["function"]), f"{row['file']} defines no {row['function']}"
    if row["protocol"]:
        assert hasattr(protocols, row["protocol"])
    if row["wiring key"]:
        cls = _component_class(wiring, row["wiring key"])
        owner = row["function"].rpartition(".")[0]
        if owner:
            documented = f"{_module(row['file'])}.{owner}"
            lineage = [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]
            assert documented in lineage, (row["wiring key"], lineage)
