"""What the engine's request validation accepts, said in JSON Schema for the OpenAPI document.

The request dataclasses (``wick.engine.protocol``) give the fields and their types; their
``from_dict``/``__post_init__`` add rules the types cannot say (ranges, a field that needs
another, a message's fields by its role). Those rules are written here from the protocol's own
constants, and ``tests/server/test_api.py`` holds the two against each other: schemathesis
generates requests the schema allows and forbids, and the server must answer the first and
refuse the second. What no schema can say is left out, and named where the test skips it:
how many tokens a prompt makes, tool names that repeat, a ``tool_choice`` naming a function
that ``tools`` lacks, ``max_tokens`` and ``max_completion_tokens`` that differ, ``best_of``
unequal to ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engine.protocol import (
    _DEFAULT_ONLY_CHAT,
    _DEFAULT_ONLY_COMPLETION,
    _IGNORED,
    INT32_MAX,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_N,
    MAX_STOP_SEQUENCES,
    MAX_TOP_LOGPROBS,
    REASONING_EFFORTS,
    ROLES,
    TEMPLATE_RESERVED,
)
from ..engine.tools import MAX_TOOLS, TOOL_NAME_PATTERN

NULL = {"type": "null"}


@dataclass(frozen=True, slots=True)
class Served:
    """What the served models allow (the largest of each, when they differ), or the
    protocol's own bounds before they are loaded."""

    vocab_size: int | None = None
    max_n: int = MAX_N
    context_window: int | None = None

    @property
    def token_id(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer", "minimum": 0}
        if self.vocab_size is not None:
            out["maximum"] = self.vocab_size - 1
        return out

    @property
    def token_key(self) -> str:
        """``logit_bias`` keys: token ids as decimal strings."""
        if self.vocab_size is None:
            return "^(0|[1-9][0-9]{0,8})$"
        return integer_below(self.vocab_size)

    @property
    def max_tokens(self) -> int:
        """At least one prompt token and the output fit the context window."""
        return INT32_MAX if self.context_window is None else self.context_window - 1

RESPONSE_FORMAT = {"oneOf": [
    {"type": "object", "additionalProperties": False, "required": ["type"],
     "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "additionalProperties": False, "required": ["type", "json_schema"],
     "properties": {"type": {"const": "json_schema"}, "json_schema": {
         "type": "object", "additionalProperties": False, "required": ["name"], "properties": {
             "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
             "description": {"type": ["string", "null"]},
             "schema": {"type": ["object", "null"]},  # null: any JSON object
             "strict": {"type": ["boolean", "null"]}}}}},
    {"type": "object", "additionalProperties": False, "required": ["type", "grammar"],
     "properties": {"type": {"const": "grammar"},
                    "grammar": {"type": "string", "minLength": 1,
                                "description": "xgrammar EBNF with a root rule (wick)"}}},
]}

TOOL = {"type": "object", "additionalProperties": False, "required": ["type", "function"],
        "properties": {"type": {"const": "function"}, "function": {
            "type": "object", "additionalProperties": False, "required": ["name"],
            "properties": {"name": {"type": "string", "pattern": TOOL_NAME_PATTERN},
                           "description": {"type": ["string", "null"]},
                           "parameters": {"type": ["object", "null"]},
                           "strict": {"type": ["boolean", "null"]}}}}}

TEMPLATE_KWARGS = {"type": ["object", "null"],
                   "propertyNames": {"not": {"enum": list(TEMPLATE_RESERVED)}}}

# one message of a request (``ChatMessage.from_dict``)
# a tool call in a reply: engine/tools.py ToolCall.to_dict; streamed, with its place in the
# message (serve_chat: "index")
TOOL_CALL_FUNCTION = {"type": "object", "required": ["name", "arguments"], "properties": {
    "name": {"type": "string"}, "arguments": {"type": "string", "description": "JSON text"}}}
REPLY_TOOL_CALL = {"type": "object", "required": ["id", "type", "function"], "properties": {
    "id": {"type": "string"}, "type": {"const": "function"}, "function": TOOL_CALL_FUNCTION}}
DELTA_TOOL_CALL = {**REPLY_TOOL_CALL, "required": ["index", "id", "type", "function"],
                   "properties": {"index": {"type": "integer"}, **REPLY_TOOL_CALL["properties"]}}

CHAT_REQUEST_MESSAGE = {
    "type": "object", "additionalProperties": False, "required": ["role"],
    "properties": {
        "role": {"enum": list(ROLES)},
        "content": {"anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                                        "properties": {"type": {"const": "text"},
                                                       "text": {"type": "string"}}}},
            NULL]},
        "name": {"type": ["string", "null"]},
        "tool_calls": {"anyOf": [{"type": "array", "items": {
            "type": "object", "required": ["function"], "properties": {
                "id": {"type": "string"}, "type": {"const": "function"},
                "function": TOOL_CALL_FUNCTION}}},
            NULL]},
        "tool_call_id": {"type": ["string", "null"]},
        "reasoning_content": {"type": ["string", "null"]},
        # OpenAI's, accepted when null only
        "function_call": NULL, "audio": NULL, "refusal": NULL,
    },
    "allOf": [
        # a tool result names its call; nothing else does
        {"if": {"properties": {"role": {"const": "tool"}}},
         "then": {"required": ["tool_call_id"], "properties": {"tool_call_id": {"type": "string"}}},
         "else": {"properties": {"tool_call_id": NULL}}},
        # calls and reasoning are the assistant's
        {"if": {"properties": {"role": {"not": {"const": "assistant"}}}},
         "then": {"properties": {"tool_calls": {"anyOf": [NULL, {"maxItems": 0}]},
                                 "reasoning_content": NULL}}},
        # content may be left out only beside calls
        {"if": {"not": {"required": ["tool_calls"],
                        "properties": {"tool_calls": {"type": "array", "minItems": 1}}}},
         "then": {"required": ["content"], "properties": {"content": {"not": NULL}}}},
    ],
}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or null (JSON null means "the default" for every optional request field)."""
    options = schema.get("anyOf")
    if options is not None and NULL in options or schema.get("type") == "null" \
            or schema == {}:
        return schema
    if isinstance(schema.get("type"), list) and "null" in schema["type"]:
        return schema
    return {"anyOf": [schema, NULL]}


def sampling_rules(served: Served) -> dict[str, dict[str, Any]]:
    """The fields chat and text completions share (``SamplingFields``)."""
    def integer(low: int, high: int = INT32_MAX) -> dict[str, Any]:
        return {"type": "integer", "minimum": low, "maximum": high}

    return {
        "model": {"type": "string"},
        "max_tokens": integer(1, served.max_tokens),
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": integer(0),
        "seed": {"type": "integer"},
        "stop": {"anyOf": [{"type": "string", "minLength": 1},
                           {"type": "array", "maxItems": MAX_STOP_SEQUENCES,
                            "items": {"type": "string", "minLength": 1}}]},
        "n": integer(1, served.max_n),
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "additionalProperties": False,
                           "properties": {"include_usage": {"type": "boolean"}}},
        "ignore_eos": {"type": "boolean"},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "logit_bias": {"type": "object", "maxProperties": MAX_LOGIT_BIAS_ENTRIES,
                       "propertyNames": {"pattern": served.token_key},
                       "additionalProperties": {"type": "number", "minimum": -100,
                                                "maximum": 100},
                       "description": "token id -> bias added to its logit"},
        "repetition_penalty": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
        "min_p": {"type": "number", "minimum": 0, "maximum": 1},
        "response_format": RESPONSE_FORMAT,
        "prediction": PREDICTION,
    }


# OpenAI's predicted outputs (engine/protocol.py _check_prediction)
PREDICTION = {
    "type": "object", "required": ["type", "content"], "additionalProperties": False,
    "description": "text the output is expected to resemble: drafted from, output unchanged",
    "properties": {
        "type": {"const": "content"},
        "content": {"anyOf": [
            {"type": "string"},
            {"type": "array", "items": {
                "type": "object", "required": ["type", "text"], "additionalProperties": False,
                "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]}}}


STREAM_OPTIONS_NEED_STREAM = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}}}


def chat_request(served: Served) -> dict[str, Any]:
    props = {
        **sampling_rules(served),
        "messages": {"type": "array", "minItems": 1,
                     "items": {"$ref": "#/components/schemas/ChatRequestMessage"}},
        "max_completion_tokens": {"type": "integer", "minimum": 1,
                                  "maximum": served.max_tokens},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS,
                         "description": "needs logprobs: true"},
        "tools": {"type": "array", "maxItems": MAX_TOOLS, "items": TOOL},
        "tool_choice": {"anyOf": [
            {"enum": ["none", "auto", "required"]},
            {"type": "object", "required": ["type", "function"], "properties": {
                "type": {"const": "function"},
                "function": {"type": "object", "required": ["name"],
                             "properties": {"name": {"type": "string"}}}}}]},
        "parallel_tool_calls": {"type": "boolean"},
        "chat_template_kwargs": TEMPLATE_KWARGS,
        "reasoning_effort": {"enum": list(REASONING_EFFORTS),
                             "description": "passed to a chat template that reads it (gpt-oss)"},
    }
    return _request(props, "messages", _DEFAULT_ONLY_CHAT, [
        STREAM_OPTIONS_NEED_STREAM,
        {"if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
         "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}},
        # "required" needs tools; a named function needs some
        {"if": {"required": ["tool_choice"], "properties": {"tool_choice": {"not": {
            "enum": ["none", "auto", None]}}}},
         "then": {"required": ["tools"], "properties": {"tools": {"type": "array",
                                                                   "minItems": 1}}}},
        # tool calls have a format of their own
        {"if": {"required": ["tools", "response_format"], "properties": {
            "tools": {"type": "array", "minItems": 1},
            "response_format": {"type": "object",
                                "properties": {"type": {"not": {"const": "text"}}}},
            "tool_choice": {"not": {"const": "none"}}}},
         "then": False},
    ])


def completion_request(served: Served) -> dict[str, Any]:
    tokens = {"type": "array", "items": served.token_id, "minItems": 1}
    props = {
        **sampling_rules(served),
        "prompt": {"anyOf": [{"type": "string", "minLength": 1}, tokens,
                             {"type": "array", "minItems": 1, "maxItems": 1,  # unwrapped
                              "items": {"anyOf": [{"type": "string", "minLength": 1}, tokens]}}],
                   "description": "a string, token ids, or a list of one of either"},
        "logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS,
                     "description": "how many most likely tokens to list"},
        "best_of": {"type": "integer", "description": "equal to n (wick does not rank)"},
        "echo": {"type": "boolean", "description": "the prompt before the output; with "
                 "logprobs, each prompt token's logprob (max_tokens may then be 0)"},
        "max_tokens": {"type": "integer", "minimum": 0, "maximum": served.max_tokens},
    }
    return _request(props, "prompt", _DEFAULT_ONLY_COMPLETION, [
        STREAM_OPTIONS_NEED_STREAM,
        # no new token: only when the prompt is echoed
        {"if": {"required": ["max_tokens"], "properties": {"max_tokens": {"const": 0}}},
         "then": {"required": ["echo"], "properties": {"echo": {"const": True}}}}])


def _request(props: dict[str, Any], required: str, default_only: dict[str, tuple[Any, ...]],
             rules: list[dict[str, Any]]) -> dict[str, Any]:
    properties = {name: schema if name == required else nullable(schema)
                  for name, schema in props.items()}
    for name, accepted in default_only.items():  # OpenAI's, accepted at their default only
        properties[name] = {"enum": list(accepted)}
    for name in _IGNORED:  # accepted and ignored
        properties[name] = {}
    return {"type": "object", "additionalProperties": False, "required": [required],
            "properties": properties, "allOf": rules}


def detokenize_request(served: Served) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": ["tokens"],
            "properties": {"model": {"type": ["string", "null"]},
                           "tokens": {"type": "array", "items": served.token_id}}}


def refused_beyond_any_schema(error: dict[str, Any]) -> bool:
    """Whether an error body is a refusal the document cannot announce (the module
    docstring's list): how many tokens a prompt makes, whether a grammar compiles, names
    repeated or missing across fields, two fields that must be equal."""
    return error.get("code") in ("context_length_exceeded", "invalid_grammar",
                                 "invalid_json_schema", "grammar_too_large",
                                 # which served model embeds and which makes text, and an
                                 # embedding model's size
                                 "model_not_embedding", "model_not_generative") \
        or error.get("param") in ("best_of", "max_completion_tokens", "dimensions") \
        or "Duplicate function name" in error.get("message", "") \
        or "is not in 'tools'" in error.get("message", "")


def tokenize_request() -> dict[str, Any]:
    """/tokenize: exactly one of a prompt (a string) and messages; tools and template
    variables with messages only; null for any of them means absent."""
    return {
        "type": "object", "additionalProperties": False,
        "properties": {
            "model": {"type": ["string", "null"]}, "prompt": {"type": ["string", "null"]},
            "messages": nullable({"type": "array", "minItems": 1, "items": {
                "$ref": "#/components/schemas/ChatRequestMessage"}}),
            "tools": nullable({"type": "array", "maxItems": MAX_TOOLS, "items": TOOL}),
            "chat_template_kwargs": TEMPLATE_KWARGS},
        "oneOf": [{"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                  {"required": ["messages"], "properties": {"messages": {"type": "array"}}}],
        "allOf": [{"if": {"required": [key], "properties": {key: {"type": kind}}},
                   "then": {"required": ["messages"],
                            "properties": {"messages": {"type": "array"}}}}
                  for key, kind in (("tools", "array"), ("chat_template_kwargs", "object"))],
    }


def integer_below(n: int) -> str:
    """A regular expression for the decimal numbers 0 .. n-1 as wick reads token ids (no
    leading zeros): the keys of ``logit_bias``."""
    top = str(n - 1)
    alternatives = ["0"]
    for length in range(1, len(top)):  # every number with fewer digits than n - 1
        alternatives.append("[1-9]" + (f"[0-9]{{{length - 1}}}" if length > 1 else ""))
    for i, digit in enumerate(top):  # as many digits, below n - 1 from the i-th one on
        low, high = (1 if i == 0 else 0), int(digit) - 1
        if high >= low:
            rest = len(top) - i - 1
            alternatives.append(top[:i] + f"[{low}-{high}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    alternatives.append(top)
    return "^(" + "|".join(dict.fromkeys(alternatives)) + ")$"
