"""How the packages depend on each other: schedkit.core at the bottom, no import circles, and
the cheap imports (``Req``, trace readers, the router) stay cheap."""

from __future__ import annotations

import ast
import functools
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "components":
        parts.insert(0, "schedkit")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    paths = [*(ROOT / "schedkit").rglob("*.py"), *(ROOT / "components").rglob("*.py")]
    return {_module_name(p): p for p in paths}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Every schedkit module ``path`` imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Each module's schedkit imports, parsed once for the tests that read it (they only read)."""
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in graph[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in graph:
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_core_imports_nothing_above_it():
    graph = _graph()
    core = {name for name in graph if name.startswith("schedkit.core")}
    upward = {
        name: sorted(dep for dep in graph[name] if not dep.startswith("schedkit.core"))
        for name in core
    }
    assert {name: deps for name, deps in upward.items() if deps} == {}


def _loaded_by(statement: str) -> dict:
    code = (
        f"import json, sys\n{statement}\n"
        "mods = sorted(m for m in sys.modules if m.startswith('schedkit'))\n"
        "print(json.dumps({'zmq': 'zmq' in sys.modules, 'schedkit': mods}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    "statement", ["import schedkit.core", "from schedkit import Req, SamplingParams, component"]
)
def test_the_vocabulary_loads_without_zmq_or_the_component_library(statement):
    loaded = _loaded_by(statement)
    assert not loaded["zmq"]
    assert [m for m in loaded["schedkit"] if not m.startswith("schedkit.core")] == [
        "schedkit",
        "schedkit._lazy",
    ]


@pytest.mark.parametrize(
    "statement",
    [
        "import schedkit.workloads.traces",
        "from schedkit.router import KvRouter",
        "from schedkit.kv_events import KvIndex, KvMetrics",
    ],
)
def test_trace_readers_and_the_router_do_not_load_the_component_library(statement):
    loaded = _loaded_by(statement)
    assert [m for m in loaded["schedkit"] if m.startswith("schedkit.components")] == []


def test_the_old_paths_of_the_request_and_message_types_still_import():
    from schedkit.components.io import io_struct
    from schedkit.components.io_struct import GenerateReqInput
    from schedkit.components.schedule_batch import Req
    from schedkit.core import schedule_batch

    assert Req is schedule_batch.Req
    assert GenerateReqInput is io_struct.GenerateReqInput


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("schedkit.core.protocols", "schedkit.core.edge_protocols"),
        ("schedkit.core.protocols", "schedkit.core.component_protocols"),
        ("schedkit.kv_events.structs", "schedkit.kv_events.event_structs"),
        ("schedkit.kv_events.structs", "schedkit.kv_events.wire_profiles"),
        ("schedkit.runner.presets", "schedkit.runner.specs"),
        ("schedkit.components.scheduler.batching", "schedkit.components.scheduler.kv_slots"),
        ("schedkit.components.scheduler.batching", "schedkit.components.scheduler.new_token_ratio"),
        ("schedkit.components.scheduler.batching", "schedkit.components.scheduler.prefill_adder"),
        ("schedkit.components.scheduler.batching", "schedkit.components.scheduler.decode_slots"),
    ],
)
def test_a_split_module_still_names_everything_its_parts_export(old, new):
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    for name in new_module.__all__:
        assert getattr(old_module, name) is getattr(new_module, name), name
        assert name in old_module.__all__, name


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("schedkit.runner.model_runner", "TIME_TERMS", "schedkit.runner.step_costs"),
        ("schedkit.runner.model_runner", "TOKEN_TABLE_SIZE", "schedkit.runner.token_table"),
        ("schedkit.runner.time_scale", "TIME_TERMS", "schedkit.runner.step_costs"),
        (
            "schedkit.assembly.container",
            "ComponentBuildError",
            "schedkit.assembly.component_resources",
        ),
        ("schedkit", "ComponentBuildError", "schedkit.assembly.component_resources"),
    ],
)
def test_a_name_moved_out_of_a_module_is_still_exported_there(old, name, new):
    old_module = importlib.import_module(old)
    assert getattr(old_module, name) is getattr(importlib.import_module(new), name)
    assert name in old_module.__all__


@pytest.mark.parametrize(
    ("component", "part"),
    [
        (
            "schedkit.components.scheduler.scheduler:Scheduler",
            "schedkit.components.scheduler.scheduler_decode_runs:SchedulerDecodeRuns",
        ),
        (
            "schedkit.components.io.output_streamer:OutputStreamer",
            "schedkit.components.io.decode_step_stream:DecodeStepStream",
        ),
        (
            "schedkit.runner.model_runner:SimulatedModelRunner",
            "schedkit.runner.step_costs:StepCosts",
        ),
    ],
)
def test_a_component_split_into_parts_keeps_their_methods_and_its_slots(component, part):
    def load(path):
        module, _, name = path.partition(":")
        return getattr(importlib.import_module(module), name)

    cls, mixin = load(component), load(part)
    assert mixin in cls.__mro__
    for name, value in vars(mixin).items():
        if callable(value):
            assert getattr(cls, name) is value, name
    # Every class it is made of declares its slots (a part without them would give each
    # instance a __dict__).
    assert [c.__name__ for c in cls.__mro__[:-1] if "__slots__" not in vars(c)] == []
