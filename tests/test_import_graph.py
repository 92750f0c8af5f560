"""kiln's modules import each other in one direction, at the top, and only public names.

Read from the source with ``ast`` (nothing is imported, so no import side effect hides a
problem), three rules hold for every module of ``kiln/``:

- **no import circle**: the graph of module-level imports (``TYPE_CHECKING`` ones included:
  a type that needs a circle is a sign of one) has no cycle. An edge goes to the module file an
  import names (``from ..tir import expr`` -> ``kiln.tir.expr``; ``from ..tir import Schedule``
  -> the package ``kiln.tir``);
- **imports at the top**: no import inside a function body, except of the optional third-party
  packages in :data:`OPTIONAL_DEPENDENCIES` (kiln works without them);
- **no private name across modules**: ``from x import _y`` with ``x`` another kiln module fails;
  what modules share is public, in a module that says what it is.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Packages a function may import lazily: optional dependencies, not installed everywhere.
OPTIONAL_DEPENDENCIES = {"torch", "PIL", "pyopencl", "cuda", "cupy", "ray", "lightgbm",
                         "onnxruntime", "transformers"}


@dataclass
class ImportGraph:
    """Module-level import edges between the modules of one package, and what breaks the
    rules (function-body imports, private names imported across modules)."""

    modules: dict[str, Path] = field(default_factory=dict)
    edges: dict[str, set[str]] = field(default_factory=dict)
    function_imports: list[str] = field(default_factory=list)
    private_imports: list[str] = field(default_factory=list)


def _module_names(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imported(module: str, is_package: bool, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The dotted names an import statement imports (submodule candidates for ``from``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")[: None if is_package else -1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    return [f"{base}.{a.name}" for a in node.names] + [base]


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module file a dotted name refers to (the longest module prefix), if in the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def build_import_graph(root: Path, package: str) -> ImportGraph:
    graph = ImportGraph(modules=_module_names(root, package))
    for module, path in graph.modules.items():
        is_package = path.name == "__init__.py"
        edges = graph.edges.setdefault(module, set())
        tree = ast.parse(path.read_text(), filename=str(path))

        def visit(node: ast.AST, in_function: bool, module=module, is_package=is_package,
                  edges=edges, path=path) -> None:
            for child in ast.iter_child_nodes(node):
                func = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                         ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    names = _imported(module, is_package, child)
                    where = f"{path.relative_to(root)}:{child.lineno}: {ast.unparse(child)}"
                    top = names[-1].split(".")[0] if names else ""
                    if func and top not in OPTIONAL_DEPENDENCIES:
                        graph.function_imports.append(where)
                    if isinstance(child, ast.ImportFrom):
                        source = _owner(names[-1], graph.modules)
                        for alias in child.names:
                            private = alias.name.startswith("_") and not alias.name.startswith("__")
                            if private and source is not None and source != module:
                                graph.private_imports.append(where)
                        # a submodule (``from . import expr``) or else the module itself
                        targets = [_owner(n, graph.modules) for n in names[:-1]]
                    else:
                        targets = [_owner(n, graph.modules) for n in names]
                    edges.update(t for t in targets if t is not None and t != module)
                visit(child, func)

        visit(tree, False)
    return graph


def import_cycles(graph: ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a cycle
    path through it (``a -> b -> ... -> a``)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.edges.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph.modules):
        if v not in index:
            strongconnect(v)
    return [_cycle_path(graph, set(comp)) for comp in components]


def _cycle_path(graph: ImportGraph, comp: set[str]) -> list[str]:
    """One cycle through a strongly connected component, for the failure message."""
    start = min(comp)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph.edges[path[-1]] if w in comp)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return [*path, start]
        fresh = [w for w in nxt if w not in seen]
        if not fresh:
            return [*path, start]
        path.append(fresh[0])
        seen.add(fresh[0])


GRAPH = build_import_graph(ROOT, "kiln")


def test_kiln_modules_import_each_other_without_circles():
    cycles = import_cycles(GRAPH)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_kiln_imports_at_the_top_of_modules():
    assert not GRAPH.function_imports, (
        "imports inside function bodies (move them to the top of the module; only "
        f"{sorted(OPTIONAL_DEPENDENCIES)} may be imported lazily):\n"
        + "\n".join(GRAPH.function_imports))


def test_no_private_name_is_imported_from_another_kiln_module():
    assert not GRAPH.private_imports, (
        "private names imported across modules (make them public where they live):\n"
        + "\n".join(GRAPH.private_imports))


# ---- the checks themselves ---------------------------------------------------------------------
def _package(tmp_path: Path, files: dict[str, str]) -> ImportGraph:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return build_import_graph(tmp_path, "pkg")


def test_the_checks_find_circles_lazy_imports_and_private_names(tmp_path):
    graph = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from .b import f\nfrom typing import TYPE_CHECKING\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n"
                "def f():\n    import torch\n    import json\n",
        "c.py": "from .a import _g\n",
        "sub/__init__.py": "from .. import a\n",
        "sub/d.py": "from ..b import f\nfrom .. import c as _c\n",
    })
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert [w.split(": ", 1)[1] for w in graph.function_imports] == ["import json"]
    assert [w.split(": ", 1)[1] for w in graph.private_imports] == ["from .a import _g"]
    assert graph.edges["pkg.sub.d"] == {"pkg.b", "pkg.c"}  # a submodule, not the package
    assert graph.edges["pkg.sub"] == {"pkg.a"}


def test_an_acyclic_package_passes(tmp_path):
    graph = _package(tmp_path, {"__init__.py": "from . import a, b\n", "a.py": "X = 1\n",
                                "b.py": "from .a import X\n"})
    assert import_cycles(graph) == [] and not graph.function_imports
