"""Structured output, tools, logprobs and the token routes through ``wick serve``'s REST API
with the official ``openai`` client (a tiny random Llama with a 2048-token window, on lavapipe:
the tool prompt of a template without tools support is ~800 byte tokens): outputs validated by
``jsonschema`` and pydantic, token ids against HF ``tokenizers``."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from tests.server.conftest import HELLO, LiveServer, assert_openai_error, engine_loader, post

LONG_WINDOW = 2048


@pytest.fixture(scope="module")
def tiny_long(tiny_long_artifact):
    """(tests/conftest.py: the browser's structured-output tests run it too)"""
    return tiny_long_artifact


@pytest.fixture(scope="module")
def server(tiny_long):
    from wick.server.app import ModelPool, create_app

    live = LiveServer(create_app(ModelPool([engine_loader(tiny_long)])))
    live.wait_ready()
    yield live
    live.stop()

SCHEMA = {"type": "object", "properties": {
    "ok": {"type": "boolean"}, "size": {"enum": ["S", "M", "L"]},
    "count": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["ok", "size", "count"]}


class Shirt(BaseModel):
    size: Literal["S", "M", "L"]
    in_stock: bool
    price: int = Field(ge=1, le=500)


def test_json_schema_through_the_openai_client(client, names):
    r = client.chat.completions.create(
        model=names[0], messages=HELLO, max_tokens=64, temperature=0.8, seed=5, n=2,
        response_format={"type": "json_schema", "json_schema": {
            "name": "thing", "schema": SCHEMA, "strict": True}})
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_parse_with_a_pydantic_model(client, names):
    parse = getattr(getattr(client, "beta", client).chat.completions, "parse", None) or \
        client.chat.completions.parse
    r = parse(model=names[0], messages=HELLO, max_tokens=64, temperature=0,
              response_format=Shirt)
    shirt = r.choices[0].message.parsed
    assert isinstance(shirt, Shirt) and 1 <= shirt.price <= 500
    assert Shirt.model_validate_json(r.choices[0].message.content) == shirt


def test_streamed_logprobs_and_choices_join(client, names):
    kw = dict(model=names[0], messages=HELLO, max_tokens=6, temperature=1.0, seed=7, n=3,
              logprobs=True, top_logprobs=4, frequency_penalty=0.5, presence_penalty=0.3,
              logit_bias={"17": -100})
    whole = client.chat.completions.create(**kw)
    stream = client.chat.completions.create(**kw, stream=True)
    texts, lps = ["", "", ""], [[], [], []]
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.logprobs and c.logprobs.content:
                lps[c.index] += [e.logprob for e in c.logprobs.content]
    for i, choice in enumerate(whole.choices):  # seeded: the stream repeats the whole reply
        assert texts[i] == choice.message.content
        assert lps[i] == [e.logprob for e in choice.logprobs.content]
        assert len(lps[i]) == whole.usage.completion_tokens // 3 or choice.finish_reason == "stop"
        for e in choice.logprobs.content:
            assert len(e.top_logprobs) == 4 and e.logprob <= e.top_logprobs[0].logprob + 1e-5
            assert e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob
    assert len({c.message.content for c in whole.choices}) > 1


def test_grammar_errors_through_the_client(client, names):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=names[0], messages=HELLO, max_tokens=4,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "x", "schema": {"type": "nope"}}})
    assert (e.value.body["param"], e.value.body["code"]) == (
        "response_format.json_schema.schema", "invalid_json_schema")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=names[0], prompt="x", max_tokens=4,
                                  extra_body={"response_format": {"type": "grammar",
                                                                  "grammar": "root ::= ("}})
    assert e.value.body["code"] == "invalid_grammar"
    # a grammar that matches no text (it compiles; every request ended at once, empty, "stop")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=names[0], prompt="x", max_tokens=4,
                                  extra_body={"response_format": {"type": "grammar",
                                                                  "grammar": 'root ::= root "a"'}})
    assert e.value.body["code"] == "invalid_grammar" and "no text matches" in e.value.body[
        "message"]
    # a schema whose output could break it (engine/schema_support.py): required b undescribed
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=names[0], messages=HELLO, max_tokens=4, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {
                    "type": "object", "properties": {"a": {"type": "string"}},
                    "required": ["b"]}}})
    assert (e.value.body["param"], e.value.body["code"]) == (
        "response_format.json_schema.schema", "unsupported_schema")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=names[0], messages=HELLO, max_tokens=4,
                                       logprobs=True, top_logprobs=21)
    assert e.value.body["param"] == "top_logprobs"


def test_tokenize_and_detokenize(server, engine, names, tiny_long):
    hf = Tokenizer.from_file(str(tiny_long / "tokenizer.json"))
    r = post(server, "/tokenize", {"model": names[0], "prompt": "Hello, wick!"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == hf.encode("Hello, wick!", add_special_tokens=False).ids
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == LONG_WINDOW
    r = post(server, "/tokenize", {"messages": HELLO}).json()
    chat = engine.core.chat_prompt_ids([{"role": "user", "content": "hello there"}])
    assert r["tokens"] == chat and hf.decode(chat, skip_special_tokens=False).startswith(
        "<|im_start|>user\nhello there<|im_end|>")
    r = post(server, "/detokenize", {"model": names[0], "tokens": chat}).json()
    assert r == {"prompt": hf.decode(chat, skip_special_tokens=False)}
    assert_openai_error(post(server, "/detokenize", {"tokens": [10**6]}), 400, param="tokens",
                        code="invalid_value")
    assert_openai_error(post(server, "/tokenize", {"prompt": "a", "messages": HELLO}), 400,
                        param="prompt")
    assert_openai_error(post(server, "/tokenize", {"text": "a"}), 400, param="text",
                        code="unknown_parameter")
    assert_openai_error(post(server, "/tokenize", {"model": "nope", "prompt": "a"}), 404,
                        param="model")


# ---------------------------------------------------------------------------------------------
# Tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


def _check_calls(calls, names) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_named_and_required_tool_choice_give_valid_calls(client, names):
    r = client.chat.completions.create(
        model=names[0], messages=ASK, tools=[WEATHER, TIME], max_tokens=160, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    _check_calls(choice.message.tool_calls, {"get_weather"})
    r = client.chat.completions.create(
        model=names[0], messages=ASK, tools=[WEATHER, TIME], max_tokens=160, temperature=1.0,
        seed=4, n=2, tool_choice="required", parallel_tool_calls=False)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        assert len(choice.message.tool_calls) == 1
        _check_calls(choice.message.tool_calls, {"get_weather", "get_time"})


def test_streamed_tool_calls_join_to_the_whole(client, names):
    kw = dict(model=names[0], messages=ASK, tools=[WEATHER, TIME], max_tokens=160,
              temperature=0.8, seed=9, tool_choice="required")
    whole = client.chat.completions.create(**kw).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += d.id or ""
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (t.function.name, t.function.arguments) for t in whole.message.tool_calls]


def test_tool_round_trip_and_auto(client, names):
    first = client.chat.completions.create(
        model=names[0], messages=ASK, tools=[WEATHER], max_tokens=160, temperature=0,
        tool_choice="required").choices[0].message
    history = ASK + [first.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": first.tool_calls[0].id,
                      "content": '{"temperature": 21}'}]
    final = client.chat.completions.create(model=names[0], messages=history, tools=[WEATHER],
                                           tool_choice="none", max_tokens=8, temperature=0)
    assert final.choices[0].message.tool_calls is None
    assert isinstance(final.choices[0].message.content, str)
    assert final.choices[0].finish_reason in ("stop", "length")
    # auto: text, calls, or both; any call it makes is valid
    for seed in range(3):
        r = client.chat.completions.create(model=names[0], messages=ASK, tools=[WEATHER, TIME],
                                           max_tokens=40, temperature=1.0, seed=seed)
        msg = r.choices[0].message
        if msg.tool_calls:
            _check_calls(msg.tool_calls, {"get_weather", "get_time"})
            assert r.choices[0].finish_reason == "tool_calls"
        else:
            assert "<tool_call>" not in (msg.content or "")
