"""OpenAI protocol types as stdlib dataclasses: requests (validated) and responses.

Requests are built with ``from_dict`` (what REST bodies and ``create(**kwargs)`` give), which
rejects unknown fields and names the offending ``param`` in the error. Responses read like the
``openai`` client's objects (``r.choices[0].message.content``) and ``to_dict()`` gives OpenAI's
JSON shapes. The same checks serve REST, Python and JS callers (the JS side sends the same dict).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import InvalidRequestError, UnsupportedParameterError

FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS = ("stop", "length", "abort")
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP_SEQUENCES = 4

# OpenAI parameters wick accepts only at their default value: name -> accepted values.
# Anything else raises UnsupportedParameterError naming the parameter.
_DEFAULT_ONLY_COMMON: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (None, 0),
    "presence_penalty": (None, 0),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),
}
_DEFAULT_ONLY_CHAT: dict[str, tuple[Any, ...]] = {
    **_DEFAULT_ONLY_COMMON,
    "logprobs": (None, False),
    "top_logprobs": (None,),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),  # without tools, "auto" means "none"
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
}
_DEFAULT_ONLY_COMPLETION: dict[str, tuple[Any, ...]] = {
    **_DEFAULT_ONLY_COMMON,
    "logprobs": (None,),
    "echo": (None, False),
    "suffix": (None, ""),
}
# Accepted and ignored: they change nothing about the output.
_IGNORED = ("user", "metadata", "store", "service_tier", "parallel_tool_calls")


# ---------------------------------------------------------------------------------------------
# Field checks. ``bool`` is an ``int`` in Python; JSON callers mean different things, so reject it.


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_error(param: str, expected: str, value: Any) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid type for '{param}': expected {expected}, but got {type(value).__name__} "
        f"({value!r}).",
        param=param,
        code="invalid_type",
    )


def _range_error(param: str, rule: str, value: Any) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid value for '{param}': {value!r}; it must be {rule}.",
        param=param,
        code="invalid_value",
    )


INT32_MAX = 2**31 - 1  # every count reaches the device as an int32
MAX_N = 128  # OpenAI's limit on choices per request


def _check_optional_int(param: str, value: Any, minimum: int, maximum: int = INT32_MAX) -> None:
    if value is None:
        return
    if not _is_int(value):
        raise _type_error(param, "an integer", value)
    if not minimum <= value <= maximum:
        raise _range_error(param, f"between {minimum} and {maximum}", value)


def _check_bool(param: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _type_error(param, "a boolean", value)


def _normalize_stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise _type_error("stop", "a string or a list of strings", value)
    if len(value) > MAX_STOP_SEQUENCES:
        raise _range_error("stop", f"at most {MAX_STOP_SEQUENCES} strings", list(value))
    if any(s == "" for s in value):
        raise _range_error("stop", "non-empty strings", list(value))
    return tuple(value)


@dataclass(slots=True)
class StreamOptions:
    include_usage: bool = False

    def __post_init__(self) -> None:
        _check_bool("stream_options.include_usage", self.include_usage)

    @classmethod
    def from_dict(cls, d: Any) -> StreamOptions:
        if isinstance(d, StreamOptions):
            return d
        if not isinstance(d, dict):
            raise _type_error("stream_options", "an object", d)
        for key in d:
            if key != "include_usage":
                raise _unknown_field(f"stream_options.{key}")
        return cls(include_usage=d.get("include_usage", False))


def _unknown_field(param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Unrecognized request argument supplied: '{param}'.",
        param=param,
        code="unknown_parameter",
    )


@dataclass(slots=True)
class SamplingFields:
    """The generation fields shared by chat and text completions (validated here, once)."""

    model: str | None = None
    max_tokens: int | None = None  # None: generate until the context window is full
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # wick extension: 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # wick extension (benchmarks): do not stop at EOS tokens

    def __post_init__(self) -> None:
        if self.model is not None and not isinstance(self.model, str):
            raise _type_error("model", "a string", self.model)
        _check_optional_int("max_tokens", self.max_tokens, 1)
        if not _is_number(self.temperature):
            raise _type_error("temperature", "a number", self.temperature)
        if not 0.0 <= self.temperature <= 2.0:
            raise _range_error("temperature", "between 0 and 2", self.temperature)
        if not _is_number(self.top_p):
            raise _type_error("top_p", "a number", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise _range_error("top_p", "greater than 0 and at most 1", self.top_p)
        _check_optional_int("top_k", self.top_k, 0)
        if self.top_k is None:
            self.top_k = 0
        if self.seed is not None and not _is_int(self.seed):
            raise _type_error("seed", "an integer", self.seed)
        self.stop = _normalize_stop(self.stop)
        _check_optional_int("n", self.n, 1, MAX_N)
        if self.n is None:
            self.n = 1
        _check_bool("stream", self.stream)
        _check_bool("ignore_eos", self.ignore_eos)
        if self.stream_options is not None:
            self.stream_options = StreamOptions.from_dict(self.stream_options)
            if not self.stream:
                raise InvalidRequestError(
                    "The 'stream_options' parameter is only allowed when 'stream' is true.",
                    param="stream_options",
                    code="invalid_value",
                )
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


_SAMPLING_KEYS = (
    "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
    "stream_options", "ignore_eos",
)


def _split_fields(
    d: Any, own: tuple[str, ...], default_only: dict[str, tuple[Any, ...]]
) -> dict[str, Any]:
    """Check a request dict's keys; return the ones that become dataclass fields."""
    if not isinstance(d, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_type")
    kwargs: dict[str, Any] = {}
    for key, value in d.items():
        if key in own or key in _SAMPLING_KEYS:
            # JSON null means "default" for every optional OpenAI field.
            if value is not None:
                kwargs[key] = value
        elif key in default_only:
            accepted = default_only[key]
            if not any(value == a and type(value) is not bool or value is a for a in accepted):
                raise UnsupportedParameterError(key)
        elif key in _IGNORED:
            continue
        else:
            raise _unknown_field(key)
    return kwargs


# ---------------------------------------------------------------------------------------------
# Messages


@dataclass(slots=True)
class ChatMessage:
    """One message: in a request (any role) or as a response's ``message`` (assistant)."""

    role: str
    content: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise _range_error("role", f"one of {', '.join(ROLES)}", self.role)
        if self.content is not None and not isinstance(self.content, str):
            raise _type_error("content", "a string", self.content)

    @classmethod
    def from_dict(cls, d: Any, index: int = 0) -> ChatMessage:
        where = f"messages[{index}]"
        if isinstance(d, ChatMessage):
            return d
        if not isinstance(d, dict):
            raise _type_error(where, "an object", d)
        for key in d:
            if key not in ("role", "content", "name"):
                if key in ("tool_calls", "tool_call_id", "function_call", "audio", "refusal"):
                    if d[key] is None:
                        continue
                    raise UnsupportedParameterError(f"{where}.{key}")
                raise _unknown_field(f"{where}.{key}")
        if "role" not in d:
            raise InvalidRequestError(
                f"Missing required parameter: '{where}.role'.", param=f"{where}.role",
                code="missing_required_parameter",
            )
        role = d["role"]
        if role not in ROLES:
            raise _range_error(f"{where}.role", f"one of {', '.join(ROLES)}", role)
        name = d.get("name")
        if name is not None and not isinstance(name, str):
            raise _type_error(f"{where}.name", "a string", name)
        return cls(role=role, content=_content_text(d.get("content"), where), name=name)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        return out


def _content_text(content: Any, where: str) -> str:
    """A message's content as one string: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return content
    if content is None:
        raise InvalidRequestError(
            f"Missing required parameter: '{where}.content'.", param=f"{where}.content",
            code="missing_required_parameter",
        )
    if not isinstance(content, list):
        raise _type_error(f"{where}.content", "a string or a list of content parts", content)
    texts = []
    for j, part in enumerate(content):
        pwhere = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            raise _type_error(pwhere, "an object", part)
        if part.get("type") != "text":
            raise UnsupportedParameterError(
                f"{pwhere}.type",
                f"Content part type {part.get('type')!r} is not supported; only 'text' parts are.",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise _type_error(f"{pwhere}.text", "a string", text)
        texts.append(text)
    return "".join(texts)


# ---------------------------------------------------------------------------------------------
# Requests


@dataclass(slots=True)
class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = field(default_factory=list)

    def __post_init__(self) -> None:
        SamplingFields.__post_init__(self)
        if not isinstance(self.messages, list):
            raise _type_error("messages", "an array", self.messages)
        if not self.messages:
            raise InvalidRequestError(
                "'messages' must contain at least one message.", param="messages",
                code="invalid_value",
            )
        self.messages = [ChatMessage.from_dict(m, i) for i, m in enumerate(self.messages)]

    @classmethod
    def from_dict(cls, d: Any) -> ChatCompletionRequest:
        kwargs = _split_fields(d, ("messages", "max_completion_tokens"), _DEFAULT_ONLY_CHAT)
        if "messages" not in kwargs:
            raise InvalidRequestError(
                "Missing required parameter: 'messages'.", param="messages",
                code="missing_required_parameter",
            )
        # max_completion_tokens is the newer name of max_tokens; both given must agree.
        if "max_completion_tokens" in kwargs:
            mct = kwargs.pop("max_completion_tokens")
            if "max_tokens" in kwargs and kwargs["max_tokens"] != mct:
                raise InvalidRequestError(
                    "'max_tokens' and 'max_completion_tokens' differ; give only one.",
                    param="max_completion_tokens", code="invalid_value",
                )
            _check_optional_int("max_completion_tokens", mct, 1)
            kwargs["max_tokens"] = mct
        return cls(**kwargs)


@dataclass(slots=True)
class CompletionRequest(SamplingFields):
    """A text completion. ``prompt`` is a string (tokenized with BOS rules) or token ids (as-is)."""

    prompt: str | list[int] = ""

    def __post_init__(self) -> None:
        SamplingFields.__post_init__(self)
        p = self.prompt
        if isinstance(p, str):
            if p == "":
                raise _range_error("prompt", "a non-empty string or token list", p)
        elif isinstance(p, list) and p and all(_is_int(t) for t in p):
            if any(t < 0 for t in p):
                raise _range_error("prompt", "non-negative token ids", p)
        elif isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            # A batch of one: unwrap (OpenAI clients often send [prompt]).
            self.prompt = p[0]
            self.__post_init__()
        elif isinstance(p, list) and len(p) > 1 and all(isinstance(x, (str, list)) for x in p):
            raise UnsupportedParameterError(
                "prompt", "Batched prompts are not supported; send one request per prompt."
            )
        else:
            raise _type_error("prompt", "a string or a list of token ids", p)

    @classmethod
    def from_dict(cls, d: Any) -> CompletionRequest:
        kwargs = _split_fields(d, ("prompt", "best_of"), _DEFAULT_ONLY_COMPLETION)
        if "prompt" not in kwargs:
            raise InvalidRequestError(
                "Missing required parameter: 'prompt'.", param="prompt",
                code="missing_required_parameter",
            )
        best_of = kwargs.pop("best_of", None)
        if best_of is not None and best_of != kwargs.get("n", 1):
            raise UnsupportedParameterError("best_of")
        return cls(**kwargs)


# ---------------------------------------------------------------------------------------------
# Responses


@dataclass(slots=True)
class CompletionUsage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int = -1  # filled in from the two above

    def __post_init__(self) -> None:
        if self.total_tokens < 0:
            self.total_tokens = self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


def _check_finish(reason: str | None) -> None:
    if reason is not None and reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {reason!r}")


@dataclass(slots=True)
class ChatCompletionChoice:
    index: int
    message: ChatMessage
    finish_reason: FinishReason | None
    logprobs: None = None

    def __post_init__(self) -> None:
        _check_finish(self.finish_reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "message": self.message.to_dict(),
            "logprobs": None,
            "finish_reason": self.finish_reason,
        }


@dataclass(slots=True)
class ChatCompletion:
    id: str  # "chatcmpl-..."
    created: int  # unix seconds
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage
    object: str = "chat.completion"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [c.to_dict() for c in self.choices],
            "usage": self.usage.to_dict(),
        }


@dataclass(slots=True)
class ChoiceDelta:
    role: str | None = None  # "assistant" in a choice's first chunk only
    content: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.role is not None:
            out["role"] = self.role
        if self.content is not None:
            out["content"] = self.content
        return out


@dataclass(slots=True)
class ChunkChoice:
    index: int
    delta: ChoiceDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None

    def __post_init__(self) -> None:
        _check_finish(self.finish_reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "delta": self.delta.to_dict(),
            "logprobs": None,
            "finish_reason": self.finish_reason,
        }


@dataclass(slots=True)
class ChatCompletionChunk:
    id: str  # the same for every chunk of one request
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None  # only on the final chunk, when include_usage
    object: str = "chat.completion.chunk"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [c.to_dict() for c in self.choices],
        }
        if self.usage is not None:
            out["usage"] = self.usage.to_dict()
        return out


@dataclass(slots=True)
class CompletionChoice:
    text: str
    index: int
    finish_reason: FinishReason | None
    logprobs: None = None

    def __post_init__(self) -> None:
        _check_finish(self.finish_reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "index": self.index,
            "logprobs": None,
            "finish_reason": self.finish_reason,
        }


@dataclass(slots=True)
class Completion:
    """A text completion, or (streaming) one chunk of it: OpenAI uses one shape for both."""

    id: str  # "cmpl-..."
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
    object: str = "text_completion"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [c.to_dict() for c in self.choices],
        }
        if self.usage is not None:
            out["usage"] = self.usage.to_dict()
        return out
