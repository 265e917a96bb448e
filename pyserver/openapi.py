"""The OpenAPI document's schemas: responses generated from the engine's protocol dataclasses
(never written again here), requests from ``request_schemas`` (the dataclasses' fields with
the rules their validation enforces, tested against it)."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from ..engine.embeddings import ENCODING_FORMATS, MAX_INPUTS
from ..engine.protocol import ChatCompletion, ChatCompletionChunk, Completion
from .request_schemas import (
    CHAT_REQUEST_MESSAGE,
    DELTA_TOOL_CALL,
    REPLY_TOOL_CALL,
    Served,
    chat_request,
    completion_request,
    detokenize_request,
    tokenize_request,
)


def protocol_schemas(served: Served = Served()) -> tuple[dict[str, dict], dict[str, Any]]:
    """(component schemas, per-route ``openapi_extra``), bounded by what the ``served``
    models allow."""
    components: dict[str, dict] = {}

    def ref(cls: type) -> dict[str, str]:
        schema = TypeAdapter(cls).json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[cls.__name__] = schema
        return {"$ref": f"#/components/schemas/{cls.__name__}"}

    def named(name: str, schema: dict[str, Any]) -> dict[str, str]:
        components[name] = schema
        return {"$ref": f"#/components/schemas/{name}"}

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

    def route(request: dict[str, str], response: type, chunk: type,
              example: dict[str, Any]) -> dict[str, Any]:
        return {
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": request, "example": example}}},
            "responses": {"200": {"description": "the completion, or with stream: true an SSE "
                                                 "stream of chunks ending in data: [DONE]",
                                  "content": {"application/json": {"schema": ref(response)},
                                              "text/event-stream": {"schema": ref(chunk)}}},
                          **errors},
        }

    named("ChatRequestMessage", CHAT_REQUEST_MESSAGE)
    extras = {
        "chat": route(named("ChatCompletionRequest", chat_request(served)), ChatCompletion,
                      ChatCompletionChunk,
                      {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16}),
        "completion": route(named("CompletionRequest", completion_request(served)),
                            Completion, Completion,
                            {"prompt": "Once upon a time", "max_tokens": 16}),
        "errors": errors,
        "tokenize": _token_route(
            tokenize_request(),
            {"type": "object", "required": ["tokens", "count", "max_model_len"], "properties": {
                "tokens": {"type": "array", "items": {"type": "integer"}},
                "count": {"type": "integer"}, "max_model_len": {"type": "integer"}}},
            {"prompt": "Hello!"}, errors),
        "detokenize": _token_route(detokenize_request(served),
            {"type": "object", "required": ["prompt"],
             "properties": {"prompt": {"type": "string"}}},
            {"tokens": [1, 2, 3]}, errors),
        "embeddings": _token_route(
            named("EmbeddingRequest", embedding_request(served)),
            named("CreateEmbeddingResponse", EMBEDDING_RESPONSE),
            {"input": ["The lighthouse stood on the rocks.", "A ship passed."]}, errors),
    }
    _typed_tool_calls(components)
    return components, extras


def _typed_tool_calls(components: dict[str, dict]) -> None:
    """A reply's ``tool_calls`` are plain dicts in the protocol's dataclasses; say their shape."""
    for name, item in (("ChatMessage", REPLY_TOOL_CALL), ("ChoiceDelta", DELTA_TOOL_CALL)):
        components[name]["properties"]["tool_calls"] = {
            "anyOf": [{"type": "array", "items": item}, {"type": "null"}], "default": None}


# engine/embeddings.py's request and reply (EmbeddingRequest.from_dict checks the same fields)
def embedding_request(served: Served) -> dict[str, Any]:
    token = {"type": "integer", "minimum": 0}
    if served.vocab_size:
        token["maximum"] = served.vocab_size - 1
    tokens = {"type": "array", "minItems": 1, "items": token}
    return {
        "type": "object", "required": ["input"], "additionalProperties": False,
        "properties": {
            "input": {"anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS,
                 "items": {"type": "string", "minLength": 1}},
                tokens,
                {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": tokens}]},
            "model": {"type": "string"},
            "encoding_format": {"enum": list(ENCODING_FORMATS), "default": "float"},
            "dimensions": {"type": "integer", "minimum": 1},
            "user": {"type": "string"}}}
EMBEDDING_RESPONSE = {
    "type": "object", "required": ["object", "data", "model", "usage"], "properties": {
        "object": {"const": "list"}, "model": {"type": "string"},
        "data": {"type": "array", "items": {
            "type": "object", "required": ["object", "index", "embedding"], "properties": {
                "object": {"const": "embedding"}, "index": {"type": "integer"},
                "embedding": {"anyOf": [{"type": "array", "items": {"type": "number"}},
                                        {"type": "string"}]}}}},
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"],
                  "properties": {"prompt_tokens": {"type": "integer"},
                                 "total_tokens": {"type": "integer"}}}}}


def _token_route(request: dict, response: dict, example: dict, errors: dict) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {
                "schema": request, "example": example}}},
            "responses": {"200": {"description": "OK", "content": {"application/json": {
                "schema": response}}}, **errors}}
