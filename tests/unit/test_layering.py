"""Parts import downward only, and no module imports itself back through another.

The import graph is read from the source (every import, including those inside functions and
under TYPE_CHECKING: a cycle hidden in a function is still a cycle). A part is a top-level
module or subpackage of `ledgerloop` (or a module LAYERS names, when it belongs higher than
the rest of its package); LAYERS orders them, and a part may import only parts of
lower layers (and its own modules). Moving a part, or adding one, means placing it here.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "app"

#: Lowest first. The package's own `__init__` (the public facade) sits above all of them.
LAYERS: list[set[str]] = [
    # The HTTP API's client: it imports nothing of the server.
    {"version", "errors", "faults", "client", "pricing"},
    # Which URL runs through a pooler: registered by config, read by every connection.
    # ... and how many connections a process may hold, and their names (db.footprint).
    {"db.pooling", "db.footprint"},
    {"config", "failures", "telemetry", "idle"},
    {"db", "sandbox", "fleet.fence"},
    {"models", "tools", "runs", "effects"},
    # Live run streams: read the run store, fanned out over one LISTEN (under http).
    {"approvals", "mcptools", "streams", "schedules"},
    # The effects' services: they deliver over HTTP (effects.delivery) and MCP (mcptools).
    {"runtime", "effects.relay", "effects.reconciler"},
    # Liveness, takeover, the step fence and dispatch: under the agent, whose steps it fences.
    {"fleet"},
    {"agent", "effects.testing"},
    {"control", "examples", "retention"},
    {"http"},
    {"services", "worker"},
    {"testing", "deploy"},
    {"demo"},
    {"cli"},
]
FACADE = "ledgerloop"


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SOURCE / "ledgerloop").rglob("*.py"):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the ledgerloop modules it imports (a `from pkg import mod` names mod)."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                if not base.startswith(FACADE):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    graph[name].add(sub if sub in modules else base)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name.startswith(FACADE))
        graph[name].discard(name)
    return graph


def part_of(module: str) -> str:
    """The most specific declared part holding `module` (a part may be a module of a
    subpackage, like the relay, when it belongs higher than its package)."""
    pieces = module.split(".")
    declared = set().union(*LAYERS)
    for end in range(len(pieces), 1, -1):
        candidate = ".".join(pieces[1:end])
        if candidate in declared:
            return candidate
    return pieces[1] if len(pieces) > 1 else FACADE


def layer_of(part: str) -> int:
    if part == FACADE:
        return len(LAYERS)
    for level, parts in enumerate(LAYERS):
        if part in parts:
            return level
    raise AssertionError(f"part {part!r} has no layer: add it to LAYERS in {__file__}")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_part_imports_only_lower_layers() -> None:
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        for target in targets
        if part_of(module) != part_of(target)
        and layer_of(part_of(target)) >= layer_of(part_of(module))
    )
    assert upward == [], "imports that go up or sideways between parts:\n" + "\n".join(upward)


def test_no_module_imports_the_facade() -> None:
    inward = sorted(m for m, targets in import_graph().items() if FACADE in targets and m != FACADE)
    assert inward == [], f"modules importing the `ledgerloop` facade: {inward}"


def test_no_import_cycle_between_modules() -> None:
    assert cycles(import_graph()) == []


def test_the_checks_catch_a_cycle_and_an_upward_import() -> None:
    graph = {"ledgerloop.db.a": {"ledgerloop.db.b"}, "ledgerloop.db.b": {"ledgerloop.db.a"}}
    assert cycles(graph) == [["ledgerloop.db.a", "ledgerloop.db.b"]]
    assert layer_of(part_of("ledgerloop.db.a")) < layer_of(part_of("ledgerloop.agent.loop"))
    with pytest.raises(AssertionError, match="no layer"):
        layer_of("nowhere")
