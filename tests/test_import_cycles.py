"""No import cycles between wick's own modules: every ``import`` counts, those inside functions
and under ``TYPE_CHECKING`` too (a lazy import that closes a cycle is still a cycle, only one
that fails later). A cycle means two modules that cannot be read, tested or moved apart; the
fix is a module both can import (as pyserver/model_pool.py, compiler/tir_lower.py and
compiler/models/kv_layout.py are)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# source directory -> the package it installs as (pyproject.toml's package-dir)
PACKAGES = {"wick": "wick", "compiler": "wick.compiler", "engine": "wick.engine",
            "native": "wick.native", "pyserver": "wick.server"}


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if "static" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports. ``from P import x`` imports
    ``P.x`` when that is a module, else ``P``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_between_wick_modules():
    known = modules()
    assert {"wick", "wick.engine.core", "wick.server.app", "wick.compiler.lower"} <= set(known)
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert "wick.compiler.tir_lower" in graph["wick.compiler.targets.cuda"]  # (edges are read)
    found = cycles(graph)
    assert found == [], "import cycles:\n" + "\n".join(
        " <-> ".join(c) + "\n    " + "\n    ".join(
            f"{m} imports {sorted(graph[m] & set(c))}" for m in c) for c in found)
