"""The OpenAPI document's schemas, generated from the engine's protocol dataclasses (never
written again here), plus the value rules their ``__post_init__`` enforces."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter

from ..engine.protocol import (
    INT32_MAX,
    MAX_TOP_LOGPROBS,
    MAX_N,
    ROLES,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
)




_RESPONSE_FORMAT = {"oneOf": [
    {"type": "object", "additionalProperties": False, "required": ["type"],
     "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "additionalProperties": False, "required": ["type", "json_schema"],
     "properties": {"type": {"const": "json_schema"}, "json_schema": {
         "type": "object", "additionalProperties": False, "required": ["name"], "properties": {
             "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
             "description": {"type": "string"}, "schema": {"type": "object"},
             "strict": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}}}}},
    {"type": "object", "additionalProperties": False, "required": ["type", "grammar"],
     "properties": {"type": {"const": "grammar"},
                    "grammar": {"type": "string", "minLength": 1,
                                "description": "xgrammar EBNF with a root rule (wick)"}}},
]}


def protocol_schemas() -> tuple[dict[str, dict], dict[str, Any]]:
    """(component schemas, per-route ``openapi_extra``), all from ``wick.engine.protocol``."""
    components: dict[str, dict] = {}

    def ref(cls: type, required: Sequence[str] = ()) -> dict[str, str]:
        schema = TypeAdapter(cls).json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        if required:  # a request: from_dict requires these, and rejects unknown fields
            schema["required"] = sorted(set(schema.get("required", [])) | set(required))
            schema["additionalProperties"] = False
        components[cls.__name__] = schema
        return {"$ref": f"#/components/schemas/{cls.__name__}"}

    error = {"$ref": "#/components/schemas/Error"}
    components["Error"] = {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
    }
    errors = {str(s): {"description": d, "content": {"application/json": {"schema": error}}}
              for s, d in ((400, "invalid request"), (401, "missing or wrong API key"),
                           (403, "a foreign Host or Origin"), (404, "unknown model"),
                           (408, "the body did not arrive in time"),
                           (413, "request body too large"),
                           (415, "Content-Type is not application/json"),
                           (503, "models still loading, or shutting down"))}

    def route(request: type, required: str, response: type, chunk: type,
              example: dict[str, Any]) -> dict[str, Any]:
        return {
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": ref(request, [required]), "example": example}}},
            "responses": {"200": {"description": "the completion, or with stream: true an SSE "
                                                 "stream of chunks ending in data: [DONE]",
                                  "content": {"application/json": {"schema": ref(response)},
                                              "text/event-stream": {"schema": ref(chunk)}}},
                          **errors},
        }

    extras = {
        "chat": route(ChatCompletionRequest, "messages", ChatCompletion, ChatCompletionChunk,
                      {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16}),
        "completion": route(CompletionRequest, "prompt", Completion, Completion,
                            {"prompt": "Once upon a time", "max_tokens": 16}),
        "errors": errors,
        "tokenize": _token_route({
            "type": "object", "additionalProperties": False, "properties": {
                "model": {"type": "string"}, "prompt": {"type": "string"},
                "messages": {"type": "array", "minItems": 1,
                             "items": {"$ref": "#/components/schemas/ChatMessage"}},
                "tools": {"type": "array", "items": {"type": "object"}},
                "chat_template_kwargs": {"type": "object"}}},
            {"type": "object", "required": ["tokens", "count", "max_model_len"], "properties": {
                "tokens": {"type": "array", "items": {"type": "integer"}},
                "count": {"type": "integer"}, "max_model_len": {"type": "integer"}}},
            {"prompt": "Hello!"}, errors),
        "detokenize": _token_route({
            "type": "object", "additionalProperties": False, "required": ["tokens"],
            "properties": {"model": {"type": "string"},
                           "tokens": {"type": "array", "items": {"type": "integer",
                                                                 "minimum": 0}}}},
            {"type": "object", "required": ["prompt"],
             "properties": {"prompt": {"type": "string"}}},
            {"tokens": [1, 2, 3]}, errors),
    }
    # the dataclass types role as str; its values are the protocol's ROLES
    components["ChatMessage"]["properties"]["role"]["enum"] = list(ROLES)
    _add_value_rules(components)
    return components, extras


def _token_route(request: dict, response: dict, example: dict, errors: dict) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {
                "schema": request, "example": example}}},
            "responses": {"200": {"description": "OK", "content": {"application/json": {
                "schema": response}}}, **errors}}


def _add_value_rules(components: dict[str, dict]) -> None:
    """The value rules the dataclasses' ``__post_init__`` enforce, which their types cannot
    say: the schema accepts what the server accepts and refuses what it refuses."""
    ranges = {"max_tokens": {"minimum": 1, "maximum": INT32_MAX},
              "temperature": {"minimum": 0, "maximum": 2},
              "top_p": {"exclusiveMinimum": 0, "maximum": 1},
              "top_k": {"minimum": 0, "maximum": INT32_MAX},
              "n": {"minimum": 1, "maximum": MAX_N},
              "frequency_penalty": {"minimum": -2, "maximum": 2},
              "presence_penalty": {"minimum": -2, "maximum": 2},
              "repetition_penalty": {"exclusiveMinimum": 0, "maximum": 10},
              "min_p": {"minimum": 0, "maximum": 1}}
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = components[name]["properties"]
        for field_name, rule in ranges.items():
            for option in props[field_name].get("anyOf", [props[field_name]]):
                if option.get("type") in ("integer", "number"):
                    option.update(rule)
    components["ChatCompletionRequest"]["properties"]["messages"]["minItems"] = 1
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = components[name]["properties"]
        props["logit_bias"] = {"anyOf": [{"type": "object", "maxProperties": 1024,
                                          "propertyNames": {"pattern": "^[0-9]{1,9}$"},
                                          "additionalProperties": {"type": "number",
                                                                   "minimum": -100,
                                                                   "maximum": 100}},
                                         {"type": "null"}],
                               "description": "token id -> bias added to its logit"}
        props["response_format"] = {"anyOf": [_RESPONSE_FORMAT, {"type": "null"}]}
    chat = components["ChatCompletionRequest"]["properties"]
    chat["logprobs"] = {"anyOf": [{"type": "boolean"}, {"type": "null"}]}
    chat["top_logprobs"] = {"anyOf": [{"type": "integer", "minimum": 0,
                                       "maximum": MAX_TOP_LOGPROBS}, {"type": "null"}],
                            "description": "needs logprobs: true"}
    components["CompletionRequest"]["properties"]["logprobs"] = {
        "anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
                  {"type": "null"}], "description": "how many most likely tokens to list"}

    tokens = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    components["CompletionRequest"]["properties"]["prompt"] = {
        "anyOf": [{"type": "string", "minLength": 1}, tokens,
                  {"type": "array", "minItems": 1, "maxItems": 1,  # a batch of one: unwrapped
                   "items": {"anyOf": [{"type": "string", "minLength": 1}, tokens]}}],
        "description": "a string, token ids, or a list of one of either"}
