"""What a JSON schema asks that constrained decoding cannot enforce.

The grammar compiler (xgrammar, natively and in the browser) turns a schema into a grammar
and leaves out what a grammar cannot say, without a word: measured on xgrammar 0.1.27, a
string that breaks any of ``UNENFORCED`` still matched (``not``, ``if``/``then``/``else``,
``dependentRequired``/``dependentSchemas``, ``uniqueItems``, ``contains`` and its counts,
``multipleOf``), and so did an object without a ``required`` property that ``properties`` does
not describe (``{"properties": {"a": ...}, "required": ["b"]}`` gave ``{"a": "..."}``). A
request whose output could break its own schema gets a 400 naming the keyword and where it is
(so does a ``$ref`` that names nothing in the document: xgrammar's own message for it is a C++
check, "Check failed: (current.get().is<picojson::object>() ...)"),
as OpenAI's structured outputs and vLLM's xgrammar backend refuse what they do not support,
instead of output that fails the caller's validation.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from .errors import InvalidRequestError

# keywords whose value is one subschema, a list of them, or an object of them
SCHEMA_ONE = ("additionalProperties", "additionalItems", "unevaluatedProperties",
              "unevaluatedItems", "contains", "propertyNames", "not", "if", "then", "else",
              "contentSchema", "items")
SCHEMA_LIST = ("prefixItems", "anyOf", "oneOf", "allOf", "items")
SCHEMA_MAP = ("properties", "patternProperties", "dependentSchemas")
SCHEMA_DEFS = ("$defs", "definitions")
# keywords the grammar leaves out (above)
UNENFORCED = ("not", "if", "then", "else", "dependentRequired", "dependentSchemas",
              "uniqueItems", "contains", "minContains", "maxContains", "multipleOf")


def check_enforceable(schema: Any, param: str, refs_only: bool = False) -> None:
    """Raise a 400 (code ``unsupported_schema``) for the first part of ``schema`` the grammar
    would not enforce: of what the root reaches (following local ``$ref``; a definition no
    one refers to is not compiled into anything). ``refs_only``: only references that name
    nothing (a tool's parameters, compiled the same way). The schema's size is bounded
    before (GrammarLimits): the walk is too, and it has no recursion."""
    stack: list[tuple[Any, str]] = [(schema, "#")]
    seen: set[int] = set()
    while stack:
        node, where = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = _pointer_target(schema, ref)
            if not isinstance(target, (dict, bool)):
                raise _unsupported(param, where, f"'$ref' '{ref}', which names no schema in "
                                   "this document,", "point it at one (e.g. '#/$defs/Name'; "
                                   "references to other documents are not fetched)")
            stack.append((target, ref))
        if not refs_only:
            _check_node(node, where, param)
        stack.extend(children(node, where))


def _check_node(node: dict, where: str, param: str) -> None:
    for keyword in UNENFORCED:
        if keyword not in node or node[keyword] is False:
            continue
        if keyword == "multipleOf" and node[keyword] == 1 and node.get("type") == "integer":
            continue  # (every integer is)
        raise _unsupported(param, where, f"'{keyword}'", "remove it, or check the output "
                           "against it yourself")
    required, properties = node.get("required"), node.get("properties")
    if isinstance(required, list):
        named = properties if isinstance(properties, dict) else {}
        loose = [r for r in required if isinstance(r, str) and r not in named]
        if loose:
            raise _unsupported(param, where, f"'required' property '{loose[0]}', which "
                               "'properties' does not describe,", "describe it under "
                               "'properties' (a required property must have a schema)")


def children(node: dict, where: str) -> list[tuple[Any, str]]:
    """The subschemas in ``node`` itself, each with its JSON pointer under ``where``
    (definitions are reached through references)."""
    out: list[tuple[Any, str]] = []
    for key in SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            out.append((node[key], f"{where}/{key}"))
    for key in SCHEMA_LIST:
        if isinstance(node.get(key), list):
            out.extend((s, f"{where}/{key}/{i}") for i, s in enumerate(node[key]))
    for key in SCHEMA_MAP:
        if isinstance(node.get(key), dict):
            out.extend((s, f"{where}/{key}/{name}") for name, s in node[key].items())
    return out


def _unsupported(param: str, where: str, what: str, fix: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"The schema in '{param}' has {what} at {where}: constrained decoding cannot enforce "
        f"it, so the output could break the schema; {fix}.", param=param,
        code="unsupported_schema")


_MISSING = object()


def resolve_ref(root: Any, ref: str) -> dict | None:
    """A local reference (``#``, ``#/$defs/x``, any JSON pointer into the document) -> its
    target schema, or None (remote, broken, or a boolean schema)."""
    node = _pointer_target(root, ref)
    return node if isinstance(node, dict) else None


def _pointer_target(root: Any, ref: str) -> Any:
    """What a local reference points at (any JSON value), or ``_MISSING``."""
    if not ref.startswith("#"):
        return _MISSING
    node = root
    pointer = unquote(ref[1:])
    if pointer:
        if not pointer.startswith("/"):
            return _MISSING
        for part in pointer[1:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isascii() and part.isdigit() \
                    and int(part) < len(node):
                node = node[int(part)]
            else:
                return _MISSING
    return node
