"""The OpenAPI document's schemas, generated from the engine's protocol dataclasses (never
written again here), plus the value rules their ``__post_init__`` enforces."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter

from ..engine.protocol import (
    INT32_MAX,
    MAX_N,
    ROLES,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
)




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
    }
    # the dataclass types role as str; its values are the protocol's ROLES
    components["ChatMessage"]["properties"]["role"]["enum"] = list(ROLES)
    _add_value_rules(components)
    return components, extras


def _add_value_rules(components: dict[str, dict]) -> None:
    """The value rules the dataclasses' ``__post_init__`` enforce, which their types cannot
    say: the schema accepts what the server accepts and refuses what it refuses."""
    ranges = {"max_tokens": {"minimum": 1, "maximum": INT32_MAX},
              "temperature": {"minimum": 0, "maximum": 2},
              "top_p": {"exclusiveMinimum": 0, "maximum": 1},
              "top_k": {"minimum": 0, "maximum": INT32_MAX},
              "n": {"minimum": 1, "maximum": MAX_N}}
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = components[name]["properties"]
        for field_name, rule in ranges.items():
            for option in props[field_name].get("anyOf", [props[field_name]]):
                if option.get("type") in ("integer", "number"):
                    option.update(rule)
    components["ChatCompletionRequest"]["properties"]["messages"]["minItems"] = 1
    tokens = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    components["CompletionRequest"]["properties"]["prompt"] = {
        "anyOf": [{"type": "string", "minLength": 1}, tokens,
                  {"type": "array", "minItems": 1, "maxItems": 1,  # a batch of one: unwrapped
                   "items": {"anyOf": [{"type": "string", "minLength": 1}, tokens]}}],
        "description": "a string, token ids, or a list of one of either"}
