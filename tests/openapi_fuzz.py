"""Bounding the work of requests that schemathesis generates from ``/openapi.json``, for the
fuzz test (tests/server/test_api.py) and bench/reliability.py: random ``max_tokens`` and ``n``
would make each request minutes of decoding on lavapipe, random model names would all stop at
404. A value is lowered only from within the range the document allows to within it, so an
invalid request stays invalid and a valid one valid."""

from __future__ import annotations

from typing import Any

COMPLETIONS = ("/v1/chat/completions", "/v1/completions")
# field -> the value a larger valid one is lowered to
LOWERED_TO = {"max_tokens": 4, "max_completion_tokens": 4, "n": 2}


def work_bounds(openapi: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """field -> (lowered to, the largest value the served document allows)."""
    fields = openapi["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    bounds = {}
    for key, low in LOWERED_TO.items():
        (integer,) = [b for b in fields[key]["anyOf"] if b.get("type") == "integer"]
        bounds[key] = (low, integer["maximum"])
    return bounds


def bound_work(body: Any, path: str, model: str, bounds: dict[str, tuple[int, int]]) -> Any:
    """``body`` naming ``model``, and with its work bounded where ``path`` completes text."""
    if not isinstance(body, dict):
        return body
    if isinstance(body.get("model"), str):
        body["model"] = model
    if path not in COMPLETIONS:
        return body
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = LOWERED_TO["max_tokens"]
    for key, (low, most) in bounds.items():
        value = body.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                float(value).is_integer() and low < value <= most:
            body[key] = low
    return body
