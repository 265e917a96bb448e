"""Bounds on a request's grammar, checked before a grammar backend sees it
(``engine/grammar_limits.py``): each measure on the shapes that crashed or stalled xgrammar
(issue #27's reproducers), schemas people write passing, and the engine refusing with a 400
before its backend compiles anything."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.hostile_grammars import ebnf_chain, nested, properties, ref_chain
from wick.engine.errors import InvalidRequestError
from wick.engine.grammar_limits import GrammarLimits, _SchemaMeasure, ebnf_rules_and_depth

SCHEMA = "response_format.json_schema.schema"






def depth(schema) -> int:
    return _SchemaMeasure(schema, 10**9).depth


def refused(fn, *args) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as e:
        fn(*args)
    assert e.value.code == "grammar_too_large" and e.value.status == 400
    return e.value


def test_schema_depth_counts_every_kind_of_nesting():
    # root, property a, d0, items, d1, items, ..., dk
    assert depth(ref_chain(5)) == 3 + 2 * 5
    assert depth(ref_chain(4000)) == 3 + 2 * 4000  # measured without recursion
    for wrap in (lambda s: {"type": "array", "items": s},
                 lambda s: {"type": "array", "prefixItems": [s, {"type": "string"}]},
                 lambda s: {"anyOf": [{"type": "null"}, s]},
                 lambda s: {"oneOf": [s]}, lambda s: {"allOf": [s]}, lambda s: {"not": s},
                 lambda s: {"type": "object", "properties": {"x": s}},
                 lambda s: {"type": "object", "additionalProperties": s},
                 lambda s: {"if": s, "then": {"type": "string"}}):
        assert depth(nested(40, wrap)) == 41
    # a chain of bare references, and a JSON pointer with escapes
    chain = {"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(50)}}
    chain["$defs"]["d50"] = {"type": "string"}
    chain["$ref"] = "#/$defs/d0"
    assert depth(chain) == 52
    odd = {"definitions": {"a/b~c": {"type": "array", "items": {"type": "string"}}},
           "items": {"$ref": "#/definitions/a~1b~0c"}}
    assert depth(odd) == 1 + 1 + 2


def test_recursion_and_fan_out_are_measured_once():
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
    assert depth(tree) == 4  # root, node, children, items (-> node again: recursion)
    # 2**60 paths through the references, each target measured once
    fan = {"$defs": {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"},
                                         {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(60)}}
    fan["$defs"]["d60"] = {"type": "string"}
    fan["$ref"] = "#/$defs/d0"
    t0 = time.perf_counter()
    assert depth(fan) == 2 + 2 * 60
    assert time.perf_counter() - t0 < 1
    # remote or broken references are the compiler's to refuse
    assert depth({"$ref": "https://example.com/s.json"}) == 1
    assert depth({"properties": {"a": {"$ref": "#/nowhere"}}}) == 2


def test_python_objects_that_share_or_contain_themselves():
    shared = nested(40, lambda s: {"if": s, "then": s, "else": s})  # 3**40 paths
    assert depth(shared) == 41
    loop: dict = {"type": "array"}
    loop["items"] = loop
    assert depth(loop) == 1
    with pytest.raises(InvalidRequestError, match="contains itself") as e:
        GrammarLimits().check_schema(loop, SCHEMA)
    assert e.value.code == "invalid_json_schema"


def test_properties_count_named_and_required_in_every_object():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {}, "c": {}}, "required": ["b", "d"]}}, "required": ["a"],
        "$defs": {"unused": {"properties": {"e": {}}}}}
    assert _SchemaMeasure(schema, 99).properties == 1 + 3 + 1


def test_issue_reproducers_are_refused_with_the_bound_named():
    limits = GrammarLimits()
    err = refused(limits.check_schema, ref_chain(5000), SCHEMA)  # 318 KB, 10,003 deep
    assert err.param == SCHEMA and "more than 131072 bytes" in err.message
    err = refused(limits.check_schema, ref_chain(1000), SCHEMA)  # 63 KB, 2,003 deep
    assert "deeper than 32 levels" in err.message and "--grammar-max-depth" in err.message
    wide = {"enum": [f"value {i}" for i in range(20_000)]}
    err = refused(limits.check_schema, wide, SCHEMA)
    assert len(json.dumps(wide)) > 131072 and "is more than 131072 bytes as JSON" in err.message
    assert "--grammar-max-bytes" in err.message
    err = refused(limits.check_schema, properties(1001, required=True), SCHEMA)
    assert "more than 1000 object properties" in err.message and "the bound is 1000" in err.message
    err = refused(limits.check_ebnf, ebnf_chain(1001), "response_format.grammar")
    assert "1003 rules" in err.message and err.param == "response_format.grammar"
    err = refused(limits.check_ebnf, "root ::= " + "(" * 40 + '"a"' + ")" * 40, "g")
    assert "parentheses 40 deep" in err.message


def test_schemas_people_write_pass():
    limits = GrammarLimits()
    person = {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1}, "age": {"type": "integer", "minimum": 0},
        "emails": {"type": "array", "items": {"type": "string", "format": "email"}},
        "address": {"$ref": "#/$defs/address"}},
        "required": ["name"], "$defs": {"address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"}}}}}
    limits.check_schema(person, SCHEMA)
    limits.check_schema(nested(30, lambda s: {"type": "array", "items": s}), SCHEMA)
    limits.check_ebnf('root ::= item ("," item)*\nitem ::= [a-z]+ | "(" root ")"\n', "g")


def test_ebnf_is_measured_outside_strings_classes_and_comments():
    grammar = ('root ::= ("(" | "::=" | [(::=] | "\\"((") # ::= ((( comment\n'
               "r ::= (x)\n")
    assert ebnf_rules_and_depth(grammar) == (2, 1)
    assert ebnf_rules_and_depth('root ::= "unterminated (') == (1, 0)


def test_tools_are_measured_together():
    limits = GrammarLimits(max_properties=10)
    tool = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(6)}}
    limits.check_schemas([(tool, "tools[0].function.parameters")], "tools")
    err = refused(limits.check_schemas, [(tool, "tools[0].function.parameters"),
                                         (tool, "tools[1].function.parameters")], "tools")
    assert err.param == "tools" and "more than 10 object properties" in err.message
    err = refused(limits.check_schemas, [(tool, "tools[0].function.parameters"),
                                         (ref_chain(20), "tools[1].function.parameters")],
                  "tools")
    assert err.param == "tools[1].function.parameters"


def test_limits_validate_themselves():
    with pytest.raises(ValueError, match="max_depth"):
        GrammarLimits(max_depth=0)
    with pytest.raises(ValueError, match="compile_timeout_s"):
        GrammarLimits(compile_timeout_s=0)


# ---------------------------------------------------------------------------------------------
# The engine refuses before its grammar backend sees anything


def _apis(limits: GrammarLimits):
    from engine_fakes import IM_END, AsyncFakeRunner, ByteTokenizer, LiteralGrammar, make_info

    from wick.engine import AsyncEngineAPI, EngineAPI
    from wick.engine.core import EngineCore

    info = make_info()
    grammar = LiteralGrammar(info.vocab_size, IM_END)
    core = EngineCore(AsyncFakeRunner(64, info.page_size), ByteTokenizer(), info, num_pages=64,
                      grammar=grammar, grammar_limits=limits)
    return EngineAPI(core), AsyncEngineAPI(core), grammar


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": ref_chain(5000)}}}, SCHEMA),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": ref_chain(40)}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": ref_chain(40)}}],
      "tool_choice": "auto"}, "tools[0].function.parameters"),
    ({"response_format": {"type": "grammar", "grammar": ebnf_chain(40_000)}},
     "response_format.grammar"),
])
def test_engine_refuses_before_compiling(body, param):
    sync_api, async_api, grammar = _apis(GrammarLimits())
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(InvalidRequestError) as e:
        sync_api.chat.completions.create(messages=messages, **body)
    assert (e.value.param, e.value.code) == (param, "grammar_too_large")
    with pytest.raises(InvalidRequestError) as e:
        asyncio.run(async_api.chat.completions.create(messages=messages, **body))
    assert (e.value.param, e.value.code) == (param, "grammar_too_large")
    assert grammar.compiled == [] and not sync_api.core.has_unfinished()
    # what the bounds let through still reaches the backend
    r = sync_api.chat.completions.create(
        messages=messages, response_format={"type": "grammar", "grammar": 'root ::= "ok"'})
    assert r.choices[0].message.content == "ok" and grammar.compiled == ['root ::= "ok"']


def test_raised_bounds_let_a_grammar_through():
    sync_api, _, grammar = _apis(GrammarLimits(max_rules=2, max_depth=1))
    r = sync_api.chat.completions.create(
        messages=[{"role": "user", "content": "Hi"}],
        response_format={"type": "grammar", "grammar": 'root ::= "ok"'})
    assert r.choices[0].message.content == "ok"
    with pytest.raises(InvalidRequestError, match="the bound is 1"):
        sync_api.chat.completions.create(
            messages=[{"role": "user", "content": "Hi"}],
            response_format={"type": "grammar", "grammar": 'root ::= (("ok"))'})
