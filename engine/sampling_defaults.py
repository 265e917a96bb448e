"""A model's own sampling defaults: what a request that leaves temperature, top_p, top_k, min_p
or repetition_penalty unset gets, as vLLM and MLC-LLM apply a checkpoint's
``generation_config.json``.

Where they come from (the compiler writes ``model.sampling_defaults`` = ``{"values", "source"}``
into the manifest): the checkpoint's ``generation_config.json``, or, for a GGUF (which has
none), the built-in registry entry's ``sampling`` (the model card's recommendation). A model
with neither keeps OpenAI's defaults through the API; ``wick chat`` and the chat page then use
``INTERACTIVE`` (Ollama's), since temperature 1 makes small models ramble.
"""

from __future__ import annotations

from typing import Any

KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Ollama's defaults for an interactive chat with a model that says nothing of its own
INTERACTIVE = {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "repetition_penalty": 1.1}
_RANGES = {"temperature": (0.0, 2.0), "top_p": (1e-9, 1.0), "top_k": (0, 1 << 20),
           "min_p": (0.0, 1.0), "repetition_penalty": (1e-9, 10.0)}


def read_values(config: Any) -> dict[str, float | int]:
    """The sampling values of a ``generation_config.json`` (or a registry entry's
    ``sampling``): the known keys with values a request could give, others left out.
    ``do_sample`` is ignored, as vLLM ignores it: a base checkpoint's ``do_sample: false`` (a
    transformers default) would otherwise make every request greedy."""
    if not isinstance(config, dict):
        return {}
    out: dict[str, float | int] = {}
    for key in KEYS:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        low, high = _RANGES[key]
        if low <= value <= high:
            out[key] = int(value) if key == "top_k" else float(value)
    return out


def section(values: dict[str, Any], source: str) -> dict[str, Any] | None:
    """The manifest's ``model.sampling_defaults`` (None: the model gives none)."""
    return {"values": dict(values), "source": source} if values else None


def fill(kwargs: dict[str, Any], defaults: dict[str, Any] | None) -> dict[str, Any]:
    """``kwargs`` with each sampling key it leaves unset (absent or null) taken from
    ``defaults`` (a ``sampling_defaults`` section)."""
    values = (defaults or {}).get("values") or {}
    if not values:
        return kwargs
    out = dict(kwargs)
    for key, value in values.items():
        if out.get(key) is None:
            out[key] = value
    return out


def chat_values(defaults: dict[str, Any] | None) -> dict[str, Any]:
    """What an interactive chat (``wick chat``, the chat page) sends for the fields its user
    left unset: nothing where the model has defaults of its own (the engine applies them),
    else ``INTERACTIVE``."""
    return {} if (defaults or {}).get("values") else dict(INTERACTIVE)


def describe(defaults: dict[str, Any] | None) -> str:
    """``temperature 0.2, top_p 0.9 (model card)``, or ``none``."""
    values = (defaults or {}).get("values") or {}
    if not values:
        return "none"
    return ", ".join(f"{k} {v:g}" for k, v in values.items()) + f" ({defaults['source']})"
