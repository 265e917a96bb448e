"""engine/schema_support.py: a json_schema response format that asks what the grammar cannot
enforce is a 400 naming the keyword and where, each case checked against xgrammar itself (a
string that breaks the schema still matches its grammar: if an xgrammar upgrade enforces one,
its refusal goes); schemas people write pass."""

from __future__ import annotations

import json

import pytest

from wick.engine.errors import InvalidRequestError
from wick.engine.grammar_limits import GrammarLimits
from wick.engine.schema_support import UNENFORCED, check_enforceable

SCHEMA = "response_format.json_schema.schema"
INT = {"type": "integer"}
OBJ = {"type": "object", "properties": {"a": INT, "b": INT}}
# keyword -> (a schema using it, a JSON text that breaks it); "then"/"else" and
# "minContains"/"maxContains" mean something only beside "if" and "contains", refused first
BROKEN_BY = {
    "not": ({**OBJ, "not": {"required": ["a"]}}, '{"a": 1}'),
    "if": ({**OBJ, "if": {"required": ["a"]}, "then": {"required": ["b"]}}, '{"a": 1}'),
    "dependentRequired": ({**OBJ, "dependentRequired": {"a": ["b"]}}, '{"a": 1}'),
    "dependentSchemas": ({**OBJ, "dependentSchemas": {"a": {"required": ["b"]}}}, '{"a": 1}'),
    "uniqueItems": ({"type": "array", "items": INT, "uniqueItems": True}, "[1, 1]"),
    "contains": ({"type": "array", "items": INT, "contains": {"const": 5}}, "[1]"),
    "multipleOf": ({"type": "integer", "multipleOf": 3}, "4"),
}


def xgrammar_matches(schema: dict, text: str) -> bool:
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), strict_mode=True)
    return _is_grammar_accept_string(grammar, text)


def refusal(schema) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as e:
        GrammarLimits().check_request(
            {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, [])
    assert e.value.status == 400 and e.value.code == "unsupported_schema"
    assert e.value.param == SCHEMA
    return e.value


@pytest.mark.parametrize("keyword", sorted(BROKEN_BY))
def test_each_unenforced_keyword_is_refused_where_it_is(keyword):
    schema, breaking = BROKEN_BY[keyword]
    assert xgrammar_matches(schema, breaking)  # the grammar lets the breaking text through
    nested = {"type": "object", "properties": {"inner": schema}, "required": ["inner"]}
    assert f"'{keyword}' at #/properties/inner:" in refusal(nested).message


@pytest.mark.parametrize("keyword", sorted(set(UNENFORCED) - set(BROKEN_BY)))
def test_the_companion_keywords_are_refused_alone_too(keyword):
    assert f"'{keyword}' at #:" in refusal({"type": "object", keyword: 1}).message


def test_a_required_property_properties_do_not_describe_is_refused():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}
    assert xgrammar_matches(schema, '{"a": "x"}')  # b missing, matched all the same
    message = refusal({"$defs": {"T": schema}, "$ref": "#/$defs/T"}).message
    assert "'required' property 'b'" in message and "at #/$defs/T" in message


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"not": INT, "contains": INT, "if": INT},
     "required": ["not", "contains", "if"]},  # (property names, not keywords)
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150},
                                      "tags": {"type": "array", "items": {"type": "string"},
                                               "maxItems": 3},
                                      "kind": {"enum": ["a", "b"]},
                                      "pet": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"type": "null"}]}},
     "required": ["age", "tags", "kind", "pet"], "additionalProperties": False,
     "$defs": {"Cat": {"type": "object", "properties": {"name": {"type": "string"}},
                       "required": ["name"]}}},
    {"type": "array", "items": INT, "uniqueItems": False},  # (false asks nothing)
])
def test_schemas_people_write_pass(schema):
    check_enforceable(schema, SCHEMA)
    GrammarLimits().check_request(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, [])


@pytest.mark.parametrize("ref", ["#/$defs/Missing", "https://example.com/s.json", "#nope"])
def test_a_reference_to_nothing_is_refused_in_words(ref):
    """xgrammar's own refusal of these is a C++ check's text (or, for a remote one, nothing
    wick could fetch): the 400 says what to write instead."""
    schema = {"type": "object", "properties": {"pet": {"$ref": ref}}, "required": ["pet"],
              "$defs": {"Cat": {"type": "string"}}}
    message = refusal(schema).message
    assert f"'$ref' '{ref}'" in message and "at #/properties/pet" in message
    check_enforceable({**schema, "properties": {"pet": {"$ref": "#/$defs/Cat"}}}, SCHEMA)


def test_only_what_the_root_reaches_and_true_references_count():
    """An unused definition is compiled into nothing (not refused); a reference to a boolean
    schema names one; multipleOf 1 asks nothing of an integer; a tool's broken reference is
    refused too (its keywords are not: tools worked with them before)."""
    from wick.engine.tools import parse_tools

    unused = {"type": "object", "properties": {"a": INT}, "required": ["a"],
              "$defs": {"Unused": {"not": {}}, "Any": True}}
    check_enforceable(unused, SCHEMA)
    check_enforceable({**unused, "properties": {"a": {"$ref": "#/$defs/Any"}}}, SCHEMA)
    check_enforceable({"type": "integer", "multipleOf": 1}, SCHEMA)
    assert "'$ref' '#/$defs/Unused'" not in refusal(
        {**unused, "properties": {"a": {"$ref": "#/$defs/Unused"}}}).message  # its 'not'
    tools = parse_tools([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/Gone"}, "y": {
            "type": "array", "uniqueItems": True}}}}}])
    with pytest.raises(InvalidRequestError) as e:
        GrammarLimits().check_request(None, tools)
    assert e.value.code == "unsupported_schema" and "'$ref' '#/$defs/Gone'" in e.value.message
    assert e.value.param == "tools[0].function.parameters"
