"""engine/tools.py: parsing tools and tool_choice, the prompt for templates with and without
tools support, the structural tag, and the streaming call parser (split at every offset)."""

from __future__ import annotations

import json

import pytest

from engine_fakes import ByteTokenizer, FakeRunner, make_info
from wick.engine import EngineAPI, InvalidRequestError
from wick.engine.tools import (
    CALL_BEGIN,
    ToolCallParser,
    call_text,
    parse_tool_choice,
    parse_tools,
    structural_tag,
    tools_spec_source,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}}}}
NOTE = {"type": "function", "function": {"name": "note"}}


def test_parse_tools_and_choice():
    tools = parse_tools([WEATHER, NOTE])
    assert [t.name for t in tools] == ["get_weather", "note"]
    assert tools[1].parameters == {"type": "object", "properties": {}}
    assert parse_tool_choice(None, tools) == "auto" and parse_tool_choice(None, []) == "none"
    assert parse_tool_choice({"type": "function", "function": {"name": "note"}}, tools) == "note"
    with pytest.raises(InvalidRequestError) as e:
        parse_tools([WEATHER, WEATHER])
    assert e.value.param == "tools[1].function.name"
    with pytest.raises(InvalidRequestError) as e:
        parse_tools([{"type": "function", "function": {"name": "f", "parameters": []}}])
    assert (e.value.param, e.value.code) == ("tools[0].function.parameters", "invalid_type")


def test_structural_tag_modes():
    tools = parse_tools([WEATHER, NOTE])
    auto = json.loads(structural_tag(tools_spec_source(tools, "auto", True), ["a", "b"]))
    assert auto["format"]["type"] == "triggered_tags"
    assert auto["format"]["triggers"] == [CALL_BEGIN] and not auto["format"]["at_least_one"]
    tags = auto["format"]["tags"]
    assert [t["begin"] for t in tags] == [
        '<tool_call>\n{"name": "get_weather", "arguments": ',
        '<tool_call>\n{"name": "note", "arguments": ']
    assert [t["content"]["grammar"] for t in tags] == ["a", "b"]
    assert tags[0]["end"] == "}\n</tool_call>"
    named = json.loads(structural_tag(tools_spec_source(tools, "note", False), ["b"]))
    assert named["format"]["type"] == "tags_with_separator"
    assert named["format"]["at_least_one"] and named["format"]["stop_after_first"]
    assert [t["begin"] for t in named["format"]["tags"]] == [
        '<tool_call>\n{"name": "note", "arguments": ']


def test_parser_at_every_split():
    text = ("Let me check. " + call_text("get_weather", {"city": "Paris"}) + "\n"
            + call_text("note", {}) + " done <tool_ca")
    for cut in range(len(text) + 1):
        parser = ToolCallParser()
        a, calls_a = parser.push(text[:cut])
        b, calls_b = parser.push(text[cut:])
        c, calls_c = parser.finish()
        assert a + b + c == "Let me check. \n done <tool_ca", cut
        calls = calls_a + calls_b + calls_c
        assert [(x.name, json.loads(x.arguments)) for x in calls] == [
            ("get_weather", {"city": "Paris"}), ("note", {})]
        assert parser.calls == calls
    parser = ToolCallParser()  # a block that is not a call stays text
    assert parser.push("<tool_call>nope</tool_call>x") == ("<tool_call>nope</tool_call>x", [])


def _api(template: str | None = None):
    info = make_info(**({"chat_template": template} if template else {}))
    return EngineAPI.from_runner(FakeRunner(512, info.page_size), ByteTokenizer(), info,
                                 num_pages=512)


def test_prompt_without_template_support_gets_the_system_prompt():
    api = _api()
    ask = [{"role": "user", "content": "weather?"}]
    plain = api.tokenize({"messages": ask})["tokens"]
    prep = api.endpoints["chat"].prepare(
        {"messages": ask, "tools": [WEATHER], "tool_choice": "none"})
    assert prep.prompt_ids == plain and not prep.tools and prep.grammar_spec is None
    history = ask + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3C"}]
    text = ByteTokenizer().decode(api.endpoints["chat"].prompt(
        __import__("wick.engine.protocol", fromlist=["x"]).ChatCompletionRequest.from_dict(
            {"messages": history, "tools": [WEATHER]}))[0], skip_special_tokens=False)
    assert "<tools>" in text and '"name": "get_weather"' in text  # the system prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' \
        in text  # the earlier call, as the model writes one
    assert "<tool_response>\n-3C\n</tool_response>" in text


def test_template_with_tools_support_renders_them():
    template = ("{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}"
                "{% endif %}{% for m in messages %}[{{ m.role }}]{{ m.content or '' }}"
                "{% for c in m.tool_calls or [] %}<call {{ c.function.name }} "
                "{{ c.function.arguments.city }}>{% endfor %}{% endfor %}[assistant]")
    api = _api(template)
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
               {"role": "tool", "tool_call_id": "c", "content": "cold"}]
    prep = api.endpoints["chat"].prepare({"messages": history, "tools": [WEATHER, NOTE]})
    text = ByteTokenizer().decode(prep.prompt_ids, skip_special_tokens=False)
    assert text.endswith("TOOLS:get_weather;note;[user]hi[assistant]<call get_weather Oslo>"
                         "[tool]cold[assistant]")
    # "auto" without a grammar backend: parsed, not constrained
    assert prep.tools and prep.grammar_spec is None
    with pytest.raises(InvalidRequestError) as e:  # no grammar backend in this engine
        api.chat.completions.create(messages=history, tools=[WEATHER], tool_choice="required")
    assert e.value.param == "tools"
