from __future__ import annotations

import pytest

from wick.engine import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChoiceDelta,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionRequest,
    CompletionUsage,
    ContextLengthExceededError,
    InvalidRequestError,
    MissingFeatureError,
    ModelNotFoundError,
    UnsupportedParameterError,
)

MSGS = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return ChatCompletionRequest.from_dict({"messages": MSGS, **kw})


@pytest.mark.parametrize(
    ("kw", "param", "code"),
    [
        ({"temperature": -1}, "temperature", "invalid_value"),
        ({"temperature": 2.5}, "temperature", "invalid_value"),
        ({"temperature": "hot"}, "temperature", "invalid_type"),
        ({"top_p": 0}, "top_p", "invalid_value"),
        ({"top_p": 1.5}, "top_p", "invalid_value"),
        ({"top_k": -1}, "top_k", "invalid_value"),
        ({"n": 0}, "n", "invalid_value"),
        ({"n": True}, "n", "invalid_type"),
        ({"max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"max_tokens": 1.5}, "max_tokens", "invalid_type"),
        ({"seed": "x"}, "seed", "invalid_type"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
        ({"stop": [1]}, "stop", "invalid_type"),
        ({"stop": ""}, "stop", "invalid_value"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({"bogus": 1}, "bogus", "unknown_parameter"),
        ({"frequency_penalty": 2.5}, "frequency_penalty", "invalid_value"),
        ({"presence_penalty": "1"}, "presence_penalty", "invalid_type"),
        ({"repetition_penalty": 0}, "repetition_penalty", "invalid_value"),
        ({"min_p": 1.5}, "min_p", "invalid_value"),
        ({"logprobs": 1}, "logprobs", "invalid_type"),
        ({"top_logprobs": 2}, "top_logprobs", "invalid_value"),  # needs logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_value"),
        ({"logit_bias": {"5": 101}}, "logit_bias.5", "invalid_value"),
        ({"logit_bias": {"x": 1}}, "logit_bias", "invalid_value"),
        # digits to str.isdigit, not token ids (the first two were 500s, the last token 3)
        ({"logit_bias": {"\u00b2": 1}}, "logit_bias", "invalid_value"),
        ({"logit_bias": {"\u2460": 1}}, "logit_bias", "invalid_value"),
        ({"logit_bias": {"\u0663": 1}}, "logit_bias", "invalid_value"),
        ({"logit_bias": {"1234567890": 1}}, "logit_bias", "invalid_value"),
        ({"logit_bias": [1]}, "logit_bias", "invalid_type"),
        ({"tools": [{"type": "function"}]}, "tools[0]", "invalid_value"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]},
         "tools[0].function.name", "invalid_value"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice",
         "invalid_value"),
        ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}],
          "response_format": {"type": "json_object"}}, "response_format", "invalid_value"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id",
         "missing_required_parameter"),
        # an earlier call's id is a string and its type "function" (as OpenAI, and the schema
        # and JS types generated from it, say)
        *[({"messages": [{"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": "f", "arguments": "{}"}, **bad}]}]},
           "messages[0].tool_calls[0]", "invalid_value")
          for bad in ({"id": 7}, {"type": "tool"})],
        ({"response_format": {"type": "yaml"}}, "response_format.type", "invalid_value"),
        # (unhashable: once a TypeError, a 500 found by the OpenAPI fuzz test)
        ({"response_format": {"type": ["json_object"]}}, "response_format.type", "invalid_value"),
        ({"response_format": {"type": {"a": 1}}}, "response_format.type", "invalid_value"),
        ({"response_format": "json"}, "response_format", "invalid_type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema",
         "missing_required_parameter"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
         "response_format.json_schema.name", "missing_required_parameter"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}},
         "response_format.json_schema.name", "invalid_value"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a",
                                                                     "schema": "{}"}}},
         "response_format.json_schema.schema", "invalid_type"),
        ({"response_format": {"type": "json_object", "schema": {}}},
         "response_format.schema", "unknown_parameter"),
        ({"response_format": {"type": "grammar", "grammar": ""}}, "response_format.grammar",
         "invalid_grammar"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens",
         "invalid_value"),
    ],
)
def test_bad_chat_params_name_the_param(kw, param, code):
    with pytest.raises(InvalidRequestError) as e:
        chat(**kw)
    err = e.value
    assert (err.param, err.code, err.status, err.type) == (
        param, code, 400, "invalid_request_error")
    assert err.to_dict() == {"error": {"message": err.message, "type": "invalid_request_error",
                                       "param": param, "code": code}}
    assert param in err.message


def test_unsupported_is_a_typed_subclass():
    with pytest.raises(UnsupportedParameterError) as e:
        chat(functions=[{"name": "f"}])  # the deprecated form of tools
    assert e.value.message == (
        "Unsupported parameter: 'functions' is not supported by wick yet; remove it.")


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ("hi", "messages"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": "x", "extra": 1}], "messages[0].extra"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
         "messages[0].content[0].type"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
    ],
)
def test_bad_messages_name_the_place(messages, param):
    with pytest.raises(InvalidRequestError) as e:
        ChatCompletionRequest.from_dict({"messages": messages})
    assert e.value.param == param


def test_defaults_aliases_and_normalization():
    r = chat()
    assert (r.temperature, r.top_p, r.top_k, r.n, r.max_tokens, r.stop, r.stream) == (
        1.0, 1.0, 0, 1, None, (), False)
    r = chat(max_completion_tokens=7, stop="END", frequency_penalty=0, logprobs=False,
             tools=None, user="u1", temperature=None, stream=True,
             stream_options={"include_usage": True})
    assert (r.max_tokens, r.stop, r.include_usage, r.temperature) == (7, ("END",), True, 1.0)
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    r = ChatCompletionRequest.from_dict({"messages": [{"role": "user", "content": parts}]})
    assert r.messages == [ChatMessage("user", "ab")]


def test_completion_request_prompts():
    assert CompletionRequest.from_dict({"prompt": "abc"}).prompt == "abc"
    assert CompletionRequest.from_dict({"prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    assert CompletionRequest.from_dict({"prompt": ["abc"]}).prompt == "abc"
    for bad, cls in [(None, InvalidRequestError), ("", InvalidRequestError),
                     ([1, "a"], InvalidRequestError), (["a", "b"], UnsupportedParameterError)]:
        with pytest.raises(cls) as e:
            CompletionRequest.from_dict({"prompt": bad})
        assert e.value.param == "prompt"
    assert CompletionRequest.from_dict({"prompt": "a", "echo": True, "max_tokens": 0}).echo
    for bad in ({"prompt": "a", "echo": "yes"}, {"prompt": "a", "echo": 1}):
        with pytest.raises(InvalidRequestError) as e:
            CompletionRequest.from_dict(bad)
        assert e.value.param == "echo"
    with pytest.raises(InvalidRequestError) as e:  # no new token: only with an echo
        CompletionRequest.from_dict({"prompt": "a", "max_tokens": 0})
    assert e.value.param == "max_tokens" and "0 only with echo" in e.value.message
    with pytest.raises(InvalidRequestError) as e:
        CompletionRequest.from_dict({"prompt": "a", "messages": MSGS})
    assert e.value.param == "messages"


def test_response_shapes_match_openai_json():
    r = ChatCompletion(
        id="chatcmpl-1", created=5, model="m",
        choices=[ChatCompletionChoice(0, ChatMessage("assistant", "hey"), "stop")],
        usage=CompletionUsage(3, 2),
    )
    assert r.choices[0].message.content == "hey" and r.usage.total_tokens == 5
    assert r.to_dict() == {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 5, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hey"},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                  "prompt_tokens_details": {"cached_tokens": 0},
                      "completion_tokens_details": {"accepted_prediction_tokens": 0,
                                                    "rejected_prediction_tokens": 0}},
    }
    c = ChatCompletionChunk("chatcmpl-1", 5, "m", [ChunkChoice(0, ChoiceDelta(role="assistant",
                                                                              content=""))])
    assert c.to_dict() == {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                     "logprobs": None, "finish_reason": None}],
    }
    t = Completion("cmpl-1", 5, "m", [CompletionChoice("x", 0, "length")], CompletionUsage(1, 1))
    assert t.to_dict() == {
        "id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m",
        "choices": [{"text": "x", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
                  "prompt_tokens_details": {"cached_tokens": 0},
                      "completion_tokens_details": {"accepted_prediction_tokens": 0,
                                                    "rejected_prediction_tokens": 0}},
    }
    with pytest.raises(ValueError):
        CompletionChoice("x", 0, "eos")


def test_error_messages_say_what_to_do():
    e = ContextLengthExceededError(2048, 2000, 100)
    assert e.message == (
        "This model's maximum context length is 2048 tokens. However, you requested 2100 "
        "tokens (2000 in the messages, 100 in the completion). Please reduce the length of the "
        "messages or completion.")
    assert (e.code, e.param, e.status) == ("context_length_exceeded", "messages", 400)
    m = MissingFeatureError("shader-f16", ["q4f32_1", "q0f32"], requested="q4f16_1")
    assert "shader-f16" in m.message and "use q4f32_1 or q0f32 instead" in m.message
    assert m.to_dict()["error"]["type"] == "device_error"
    nf = ModelNotFoundError("gpt-9", ["smol"])
    assert (nf.status, nf.code, nf.param) == (404, "model_not_found", "model")
