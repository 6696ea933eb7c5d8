"""ffai's modules import one another without a cycle, counting the imports made inside
functions too: a lazy import that only dodges a cycle still ties the two modules together.

Edges are read with ``ast`` from the source, so nothing is imported. ``from pkg import name``
is an edge to ``pkg.name`` when that is a module, else to ``pkg``; a module's parent package,
which Python imports first, is not an edge (``ffai/__init__.py``'s lazy facade would otherwise
join every module). Imports under ``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ffai

ROOT = Path(ffai.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("ffai", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.names: list[tuple[str, str | None]] = []  # (module, name imported from it or None)

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.names += [(alias.name, None) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            anchor = self.package.split(".")[: len(self.package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        self.names += [(base, alias.name) for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """Each ffai module and the ffai modules it imports, at module level or in a function."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        visitor = _Imports(module, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        edges = set()
        for base, name in visitor.names:
            target = f"{base}.{name}" if name is not None and f"{base}.{name}" in modules else base
            if target in modules and target != module:
                edges.add(target)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every edge is seen
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_module_and_function_level_imports():
    graph = import_graph()
    assert "ffai.errors" in graph["ffai.outputs.tracks"]  # module level
    assert "ffai.media" in graph["ffai.outputs.sheet_build"]  # inside sheet_build.build
    assert "ffai.pipeline.config" in graph["ffai.ray.workers"]  # from a subpackage's module


def test_the_cycle_finder_finds_a_lazy_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_ffai_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
