"""engine/ must run unchanged in Pyodide: it imports only the standard library (and jinja2,
lazily, in chat_template.py)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"
ALLOWED_EXTRA = {"chat_template.py": {"jinja2"}}


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                continue  # relative: inside wick.engine
            yield node, node.module or ""


def test_engine_imports_only_the_standard_library():
    files = sorted(ENGINE.glob("*.py"))
    assert len(files) >= 12
    bad, seen = [], set()
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        top_level_imports = {
            id(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node, name in _imports(tree):
            top = name.split(".")[0]
            seen.add(top)
            if top in sys.stdlib_module_names or name.startswith("wick.engine"):
                continue
            if top in ALLOWED_EXTRA.get(path.name, set()) and id(node) not in top_level_imports:
                continue  # lazy (inside a function): only paid for when a chat is rendered
            bad.append(f"{path.name}:{node.lineno} imports {name}")
    assert bad == []
    assert "jinja2" in seen  # the check does see imports (the template module's lazy one)
