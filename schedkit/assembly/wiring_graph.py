"""The graph of a wiring's eager references: its edges, its cycles and a build order."""

from __future__ import annotations

from schedkit.assembly.wiring import Wiring, iter_refs

__all__ = ["eager_edges", "find_cycles", "topological_order"]


def eager_edges(wiring: Wiring) -> dict[str, list[str]]:
    """component -> the components it takes eagerly (``!ref``), in argument order."""
    return {
        name: [r.target for v in spec.args.values() for r in iter_refs(v) if r.eager]
        for name, spec in wiring.components.items()
    }


def find_cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """Each distinct cycle of ``edges`` as a path that returns to its first node."""
    cycles, seen = [], set()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    cycles.append([*cycle, nxt])
            elif nxt in edges and state.get(nxt) is None:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in edges:
        if state.get(node) is None:
            visit(node)
    return cycles


def topological_order(edges: dict[str, list[str]]) -> list[str]:
    """Components ordered so that each comes after everything it takes eagerly (acyclic input)."""
    order: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> None:
        if node in done:
            return
        done.add(node)
        for dep in edges.get(node, ()):
            if dep in edges:
                visit(dep)
        order.append(node)

    for node in edges:
        visit(node)
    return order
