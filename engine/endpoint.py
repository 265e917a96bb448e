"""What an OpenAI endpoint is to the facades (engine/api.py): how its request is validated and
queued in the core, and how the core's outputs become the endpoint's chunks. The facades own
the step loop and nothing endpoint-specific; a non-streamed reply is the stream ``fold``-ed, so
each endpoint renders its outputs once.

The endpoints: chat (engine/serve_chat.py), completions (engine/serve_completion.py), both over
engine/serve_generate.py, and embeddings (engine/embeddings.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .core import EngineCore, SequenceOutput
from .errors import InvalidRequestError, ModelNotFoundError
from .logprob_text import TokenTexts


@dataclass(slots=True)
class Submitted:
    """A request in the core: its request ids (a generation has one, whose choices are the
    core's sequences; an embedding request one per input) and its endpoint's stream state."""

    request_ids: list[str]
    stream: bool
    state: Any  # the endpoint's: what its chunks so far leave to say
    created: int = field(default_factory=lambda: int(time.time()))


class Endpoint:
    """One endpoint over one core. ``prepare`` reads only the model's info and the tokenizer
    (a host may run it off its event loop); the rest runs on the step loop's side."""

    def __init__(self, core: EngineCore, texts: TokenTexts) -> None:
        self.core = core
        self.texts = texts

    @property
    def model(self) -> str:
        return self.core.info.model_id

    def check_model(self, model: str | None) -> None:
        info = self.core.info
        if model is not None and model not in info.names:
            raise ModelNotFoundError(model, [info.model_id])

    def prepare(self, kwargs: dict[str, Any]) -> Any:
        """Validate and tokenize: a prepared request (with ``stream`` and ``grammar_spec``)."""
        raise NotImplementedError

    def without_model(self, prep: Any) -> tuple[Submitted, list[Any]] | None:
        """A request answered without any step: its whole stream; else None."""
        return None

    def submit(self, prep: Any) -> Submitted:
        """Queue a prepared request in the core."""
        raise NotImplementedError

    def opening(self, sub: Submitted) -> list[Any]:
        return []

    def waiting_on(self, sub: Submitted) -> str | None:
        """The request id whose next output the stream needs; None once it is complete."""
        raise NotImplementedError

    def on_output(self, sub: Submitted, out: SequenceOutput) -> list[Any]:
        raise NotImplementedError

    def closing(self, sub: Submitted) -> list[Any]:
        return []

    def fold(self, sub: Submitted, chunks: list[Any]) -> Any:
        """The non-streamed reply: the stream's chunks joined."""
        raise NotImplementedError


def object_body(body: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """A JSON object body with only ``keys`` (nulls dropped)."""
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_type")
    for key in body:
        if key not in keys:
            raise InvalidRequestError(f"Unrecognized request argument supplied: '{key}'.",
                                      param=key, code="unknown_parameter")
    return {k: v for k, v in body.items() if v is not None}


def text_chars(value: Any, keys: bool = False) -> int:
    """Characters of every string in a JSON value (and of its object keys), without
    recursion."""
    chars, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, dict):
            if keys:
                chars += sum(len(k) for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return chars
