"""Bounds on what one request's grammar may ask of the grammar compiler, checked before it sees
the grammar.

xgrammar 0.1.27 recurses once per level of a JSON schema (``$ref`` chains included) and once per
EBNF rule reference, and its work grows with the square of an object's optional properties:
a ``$ref`` chain 4,000 deep crashes the process (stack overflow), an EBNF chain of 40,000
rules too, 100,000 required properties end in a fatal check, 4,000 optional properties take
15 s. So a request's grammar is measured first, with the standard library only (the browser
engine checks the same bounds: web-xgrammar aborts the worker's wasm on such input), and
refused with a 400 naming the measure and its bound when it is too large:

- ``max_bytes``: the grammar's text (a schema as JSON, an EBNF string; for tools, all their
  parameter schemas together);
- ``max_depth``: a schema's nesting, following local ``$ref`` (a reference back into its own
  chain is recursion, which the grammar keeps finite, and adds nothing); an EBNF's nesting of
  parentheses;
- ``max_properties``: a schema's object properties, named or required, in all its objects (for
  tools, in all their schemas together);
- ``max_rules``: an EBNF's rules.

The defaults take any schema or grammar people write by hand (OpenAI's own structured outputs
allow 5,000 properties and 10 levels of nesting) while keeping the slowest compile within the
bounds at about a second. ``wick serve --grammar-max-*`` raises them. The native engine then
compiles in a child process with a time budget (``wick.native.grammar_pool``), so that what
the bounds let through cannot crash or stall the server either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequestError
from .schema_support import SCHEMA_DEFS, check_enforceable, children, resolve_ref


@dataclass(frozen=True, slots=True)
class GrammarLimits:
    """What one request's grammar may be (see the module docstring), and how the native
    engine compiles it: ``compile_timeout_s`` (past it, the compile is stopped and the request
    gets a 400), ``cache_bytes`` (compiled grammars kept for reuse, by their memory) and
    ``workers`` (compiles that run at once, each in its own process). The browser engine
    checks the bounds; it cannot stop a compile once started."""

    max_bytes: int = 128 << 10
    max_depth: int = 32
    max_properties: int = 1_000
    max_rules: int = 1_000
    compile_timeout_s: float = 15.0
    cache_bytes: int = 256 << 20
    workers: int = 2

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_depth", "max_properties", "max_rules", "cache_bytes",
                     "workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GrammarLimits.{name} must be a positive integer, not "
                                 f"{value!r}")
        if not self.compile_timeout_s > 0:
            raise ValueError(f"GrammarLimits.compile_timeout_s must be positive, not "
                             f"{self.compile_timeout_s!r}")

    # -- the checks -------------------------------------------------------------------------

    def check_schema(self, schema: Any, param: str) -> None:
        """Refuse a JSON schema (the parsed object) beyond the bounds."""
        self.check_schemas([(schema, param)], param)

    def check_schemas(self, schemas: list[tuple[Any, str]], param: str) -> None:
        """Refuse schemas compiled together (a request's tools) beyond the bounds: each one's
        depth, and their bytes and properties together (blamed on ``param``). Each measure
        stops once past its bound: a 4 MB schema costs no more than a 128 KB one."""
        properties = size = 0
        for schema, where in schemas:
            try:  # first: the walks below are then over at most max_bytes of schema
                size += _json_bytes(schema, self.max_bytes - size)
            except RecursionError:  # a value (an enum, a default) nested past Python's limit
                raise self._error(where, "holds values nested too deeply to measure",
                                  "max_depth", self.max_depth) from None
            except ValueError:  # a Python object that contains itself
                raise InvalidRequestError(f"The schema in '{where}' contains itself; it "
                                          "cannot be written as JSON.", param=where,
                                          code="invalid_json_schema") from None
            if size > self.max_bytes:
                raise self._error(param, f"is more than {self.max_bytes} bytes as JSON",
                                  "max_bytes", self.max_bytes)
            measure = _SchemaMeasure(schema, self.max_depth, self.max_properties - properties)
            if measure.depth > self.max_depth:
                raise self._error(where, f"nests deeper than {self.max_depth} levels "
                                         "(following $ref)", "max_depth", self.max_depth)
            properties += measure.properties
            if properties > self.max_properties:
                raise self._error(param, f"has more than {self.max_properties} object "
                                         "properties", "max_properties", self.max_properties)

    def check_ebnf(self, grammar: str, param: str) -> None:
        """Refuse an EBNF grammar beyond the bounds."""
        size = len(grammar.encode("utf-8", "surrogatepass"))
        if size > self.max_bytes:
            raise self._error(param, f"is {size} bytes", "max_bytes", self.max_bytes)
        rules, depth = ebnf_rules_and_depth(grammar)
        if rules > self.max_rules:
            raise self._error(param, f"has {rules} rules", "max_rules", self.max_rules)
        if depth > self.max_depth:
            raise self._error(param, f"nests parentheses {depth} deep", "max_depth",
                              self.max_depth)

    def check_request(self, response_format: dict[str, Any] | None, tools: list[Any]) -> None:
        """The grammar inputs of a validated request: its ``response_format`` and the
        ``parameters`` of the ``tools`` it may call (``engine.tools.Tool``)."""
        if tools:
            self.check_schemas([(t.parameters, f"tools[{i}].function.parameters")
                                for i, t in enumerate(tools)], "tools")
            for i, t in enumerate(tools):  # (their keywords: as before, see schema_support)
                check_enforceable(t.parameters, f"tools[{i}].function.parameters",
                                  refs_only=True)
        if not response_format:
            return
        kind = response_format.get("type")
        if kind == "json_schema":
            schema = response_format["json_schema"].get("schema")
            if schema is not None:
                self.check_schema(schema, "response_format.json_schema.schema")
                # (after the bounds: what is walked is bounded)
                check_enforceable(schema, "response_format.json_schema.schema")
        elif kind == "grammar":
            self.check_ebnf(response_format["grammar"], "response_format.grammar")

    @staticmethod
    def _error(param: str, measure: str, limit: str, bound: int) -> InvalidRequestError:
        flag = "--grammar-" + limit.replace("_", "-")
        return InvalidRequestError(
            f"The grammar in '{param}' is too large to compile: it {measure}; the bound is "
            f"{bound} (GrammarLimits.{limit}; `wick serve {flag}` raises it).",
            param=param, code="grammar_too_large")


# ---------------------------------------------------------------------------------------------
# JSON schemas


def _subschemas(node: dict) -> list[Any]:
    """``node``'s own subschemas (schema_support.children's, without their places)."""
    return [s for s, _ in children(node, "") if isinstance(s, dict)]


class _SchemaMeasure:
    """A schema's depth (the longest chain of nested subschemas, through local ``$ref``) and
    its properties, in one walk without recursion: a schema nested deeper than Python's own
    recursion limit is measured, not crashed on. Each subschema is measured once (by
    identity, remembered), so a schema whose references fan out, or a Python object that
    shares subschemas, is measured in linear time; a reference back into its own chain (or a
    Python object that contains itself) adds nothing. The depth walk stops past ``cap``."""

    def __init__(self, root: Any, cap: int, properties_cap: int | None = None) -> None:
        self.root = root
        self.properties = 0
        self.depth = 0
        self._cap = cap
        self._depths: dict[int, int] = {}  # id(subschema) -> its depth
        self._count_properties(root, properties_cap)
        if isinstance(root, dict):
            roots = [root] + [d for key in SCHEMA_DEFS if isinstance(root.get(key), dict)
                              for d in root[key].values() if isinstance(d, dict)]
            for node in roots:
                self.depth = max(self.depth, self._depth(node))
                if self.depth > cap:
                    break

    def _count_properties(self, root: Any, cap: int | None) -> None:
        """Named and required properties of every object schema in the document (each schema
        counted once, wherever references lead), up to just past ``cap``."""
        stack, seen = [root], set()
        while stack and (cap is None or self.properties <= cap):
            node = stack.pop()
            if not isinstance(node, dict) or id(node) in seen:
                continue
            seen.add(id(node))
            names = set(node["properties"]) if isinstance(node.get("properties"), dict) else set()
            if isinstance(node.get("required"), list):
                names.update(r for r in node["required"] if isinstance(r, str))
            self.properties += len(names)
            stack.extend(_subschemas(node))
            for key in SCHEMA_DEFS:
                if isinstance(node.get(key), dict):
                    stack.extend(node[key].values())

    def _children(self, node: dict) -> list[dict]:
        """A node's subschemas, and its own ``$ref`` target (one level further in)."""
        out = _subschemas(node)
        ref = node.get("$ref")
        target = resolve_ref(self.root, ref) if isinstance(ref, str) else None
        if target is not None:
            out.append(target)
        return out

    def _depth(self, start: dict) -> int:
        # frames: [id of the node, its children not yet visited, deepest child so far]
        stack: list[list[Any]] = [[id(start), self._children(start), 0]]
        on_path = {id(start)}
        while True:
            frame = stack[-1]
            if len(stack) > self._cap:
                return len(stack)
            if frame[1]:
                child = frame[1].pop()
                known = self._depths.get(id(child))
                if known is None and id(child) in on_path:
                    known = 0  # recursion: finite in the grammar
                if known is not None:
                    frame[2] = max(frame[2], known)
                else:
                    on_path.add(id(child))
                    stack.append([id(child), self._children(child), 0])
                continue
            depth = 1 + frame[2]
            stack.pop()
            self._depths[frame[0]] = depth
            on_path.discard(frame[0])
            if not stack:
                return depth
            stack[-1][2] = max(stack[-1][2], depth)


def _json_bytes(value: Any, cap: int) -> int:
    """The UTF-8 size of ``value`` as JSON, counted only up to just past ``cap``."""
    size = 0
    for chunk in json.JSONEncoder(ensure_ascii=False).iterencode(value):
        size += len(chunk.encode("utf-8", "surrogatepass"))
        if size > cap:
            break
    return size


# ---------------------------------------------------------------------------------------------
# EBNF


def ebnf_rules_and_depth(grammar: str) -> tuple[int, int]:
    """(rules, deepest nesting of parentheses) of xgrammar EBNF: ``::=`` and parentheses
    counted outside string literals, character classes and ``#`` comments. Malformed text is
    measured as far as it goes (the compiler names its error)."""
    rules = depth = deepest = 0
    i, n = 0, len(grammar)
    while i < n:
        c = grammar[i]
        if c == '"' or c == "[":
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and grammar[i] != close:
                i += 2 if grammar[i] == "\\" else 1
        elif c == "#":
            end = grammar.find("\n", i)
            i = n if end < 0 else end
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth = max(0, depth - 1)
        elif c == ":" and grammar.startswith("::=", i):
            rules += 1
            i += 2
        i += 1
    return rules, deepest
