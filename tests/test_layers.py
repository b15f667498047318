"""The source's import structure: every module stands in a layer of the layers contract
(pyproject.toml, which import-linter checks), and no modules import each other in a loop
(a cycle inside one layer is one the contract cannot see)."""

from __future__ import annotations

import ast
from pathlib import Path

try:
    import tomllib
except ImportError:  # (Python 3.10: pytest's own dependency reads TOML there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def modules() -> dict[str, Path]:
    """glmc's modules by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for p in (SRC / "glmc").rglob("*.py"):
        parts = p.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports(path: Path, known: dict[str, Path], name: str) -> set[str]:
    """The glmc modules ``path`` imports anywhere in it (function-level imports too; not
    those under ``if TYPE_CHECKING:``, which never run)."""
    tree = ast.parse(path.read_text())
    skip = {id(x) for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for b in node.body for x in ast.walk(b)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = package
                for _ in range(node.level - 1):
                    here = here.rpartition(".")[0]
                base = f"{here}.{base}".rstrip(".")
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t.startswith("glmc") and t != name:
                out.add(t)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others():
    known = modules()
    graph = {name: imports(path, known, name) for name, path in known.items()}
    assert sum(map(len, graph.values())) > 300  # (the imports were read)
    assert cycles(graph) == []


def test_cycles_finds_a_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_stands_in_a_layer():
    """Each module is in the layers contract, itself or a package holding it (``io``'s
    modules are named one by one: the package is not a layer)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    named = {"glmc." + part.strip() for layer in layers
             for part in layer.replace(":", "|").split("|")}

    def covered(name: str) -> bool:
        return name in named or ("." in name and covered(name.rpartition(".")[0]))

    files = [n for n, p in modules().items() if p.name != "__init__.py"]
    assert "glmc.io.files" in files and "glmc.io" not in named
    assert [n for n in files if not covered(n)] == []
