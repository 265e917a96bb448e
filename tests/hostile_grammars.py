"""Grammar inputs that crashed or stalled xgrammar 0.1.27 (issue #27's outside probe), for the
tests of the grammar bounds and of the compile children, and for bench/reliability.py."""

from __future__ import annotations

from typing import Any, Callable


def ref_chain(k: int) -> dict[str, Any]:
    """``$defs`` d0 -> items -> ``$ref`` d1 -> ... -> dk: nests 2k + 3 levels; at k = 5000
    (318 KB, the probe's reproducer) xgrammar overflows its stack."""
    defs = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(k)}
    defs[f"d{k}"] = {"type": "integer"}
    return {"$defs": defs, "type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}},
            "required": ["a"]}


def nested(k: int, wrap: Callable[[dict], dict]) -> dict[str, Any]:
    """An integer schema wrapped ``k`` times by ``wrap``."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(k):
        schema = wrap(schema)
    return schema


def ebnf_chain(k: int) -> str:
    """``k + 2`` EBNF rules, each naming the next (977 KB at k = 40,000)."""
    return ("root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(k))
            + f'r{k} ::= "b"\n')


def properties(k: int, required: bool) -> dict[str, Any]:
    """An object of ``k`` integer properties, all required or all optional."""
    schema: dict[str, Any] = {"type": "object",
                              "properties": {f"p{i}": {"type": "integer"} for i in range(k)}}
    if required:
        schema["required"] = list(schema["properties"])
    return schema
