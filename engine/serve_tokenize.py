"""``/tokenize`` and ``/detokenize`` (as vLLM's and llama.cpp's servers have them)."""

from __future__ import annotations

from typing import Any

from .endpoint import Endpoint, object_body
from .errors import ContextLengthExceededError, InvalidRequestError
from .protocol import ChatCompletionRequest, token_ids_of
from .serve_chat import ChatEndpoint
from .serve_completion import CompletionEndpoint


def tokenize(chat: ChatEndpoint, completion: CompletionEndpoint, body: Any) -> dict[str, Any]:
    """``{model?, prompt | messages}`` -> ``{tokens, count, max_model_len}``: the ids the
    engine would prefill (a prompt with the model's BOS rule, messages through the chat
    template with the generation prompt, and ``tools`` and ``chat_template_kwargs`` as a chat
    request would)."""
    core = chat.core
    body = object_body(body, ("model", "prompt", "messages", "tools", "chat_template_kwargs"))
    chat.check_model(body.get("model"))
    if ("prompt" in body) == ("messages" in body):
        raise InvalidRequestError("Give exactly one of 'prompt' and 'messages'.",
                                  param="prompt", code="missing_required_parameter")
    if "messages" in body:
        chat.check_size(body)
        req = ChatCompletionRequest.from_dict(
            {k: body[k] for k in ("messages", "tools", "chat_template_kwargs") if k in body})
        ids = chat.prompt(req)[0]
    else:
        for key in ("tools", "chat_template_kwargs"):
            if key in body:
                raise InvalidRequestError(f"'{key}' applies to 'messages' only.", param=key,
                                          code="invalid_value")
        completion.check_size(body)
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise InvalidRequestError(
                f"Invalid type for 'prompt': expected a string, but got "
                f"{type(prompt).__name__}.", param="prompt", code="invalid_type")
        ids = core.prompt_ids(prompt)
    return {"tokens": ids, "count": len(ids), "max_model_len": core.info.context_window}


def detokenize(endpoint: Endpoint, body: Any) -> dict[str, Any]:
    """``{model?, tokens}`` -> ``{prompt}`` (special tokens kept, as written)."""
    body = object_body(body, ("model", "tokens"))
    endpoint.check_model(body.get("model"))
    core, info = endpoint.core, endpoint.core.info
    tokens = body.get("tokens")
    if isinstance(tokens, list):
        tokens = token_ids_of(tokens)
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise InvalidRequestError("'tokens' must be a list of token ids.", param="tokens",
                                  code="invalid_type")
    if len(tokens) > info.context_window:
        raise ContextLengthExceededError.before_tokenizing(
            f"'tokens' holds {len(tokens)} ids; this model's context window is "
            f"{info.context_window} tokens.", param="tokens", context_window=info.context_window)
    bad = [t for t in tokens if not 0 <= t < info.vocab_size]
    if bad:
        raise InvalidRequestError(f"Token ids {bad[:5]} are outside the vocabulary "
                                  f"[0, {info.vocab_size}).", param="tokens", code="invalid_value")
    return {"prompt": core.tokenizer.decode(tokens, skip_special_tokens=False)}
