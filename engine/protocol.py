"""OpenAI protocol types as stdlib dataclasses: requests (validated) and responses.

Requests are built with ``from_dict`` (what REST bodies and ``create(**kwargs)`` give), which
rejects unknown fields and names the offending ``param`` in the error. Responses read like the
``openai`` client's objects (``r.choices[0].message.content``) and ``to_dict()`` gives OpenAI's
JSON shapes. The same checks serve REST, Python and JS callers (the JS side sends the same dict).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .batch import MAX_TOP_LOGPROBS  # OpenAI's bound (chat); wick allows it for completions too
from .errors import InvalidRequestError, UnsupportedParameterError

FinishReason = Literal["stop", "length", "abort", "tool_calls"]
FINISH_REASONS = ("stop", "length", "abort", "tool_calls")
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP_SEQUENCES = 4

# OpenAI parameters wick accepts only at their default value: name -> accepted values.
# Anything else raises UnsupportedParameterError naming the parameter.
_DEFAULT_ONLY_COMMON: dict[str, tuple[Any, ...]] = {}
_DEFAULT_ONLY_CHAT: dict[str, tuple[Any, ...]] = {
    **_DEFAULT_ONLY_COMMON,
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "web_search_options": (None,),
}
_DEFAULT_ONLY_COMPLETION: dict[str, tuple[Any, ...]] = {
    **_DEFAULT_ONLY_COMMON,
    "suffix": (None, ""),
}
# Accepted and ignored: they change nothing about the output.
_IGNORED = ("user", "metadata", "store", "service_tier")


# ---------------------------------------------------------------------------------------------
# Field checks. ``bool`` is an ``int`` in Python; JSON callers mean different things, so reject it.


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _integral(v: Any) -> Any:
    """``v`` as an int when it is a float with no fractional part (JSON Schema, and so the
    OpenAPI document, counts 9042.0 as an integer); anything else unchanged."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def token_ids_of(values: list[Any]) -> list[Any]:
    """A list of token ids with integral floats made ints (other items left to validation)."""
    return [_integral(v) for v in values]


# request fields that are integers (validation refuses other types)
_INTEGER_FIELDS = frozenset({"max_tokens", "max_completion_tokens", "top_k", "seed", "n",
                             "top_logprobs", "best_of"})


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


def _check_optional_int(param: str, value: Any, minimum: int, maximum: int = INT32_MAX,
                        note: str = "") -> None:
    if value is None:
        return
    if not _is_int(value):
        raise _type_error(param, "an integer", value)
    if not minimum <= value <= maximum:
        raise _range_error(param, f"between {minimum} and {maximum}{note}", value)


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
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None  # token id (as a string, JSON keys) -> bias
    repetition_penalty: float = 1.0  # wick extension (as vLLM): > 1 discourages repeats
    min_p: float = 0.0  # wick extension (as vLLM): 0 = off
    response_format: dict[str, Any] | None = None
    logprobs: Any = None  # chat: bool; completions: an int (legacy shape)
    # OpenAI's predicted outputs: {"type": "content", "content": text or text parts}: the
    # text the output is expected to resemble, drafted from (engine/speculative.py); a
    # completions request takes it too (a wick extension)
    prediction: Any = None

    def __post_init__(self) -> None:
        if self.model is not None and not isinstance(self.model, str):
            raise _type_error("model", "a string", self.model)
        # (a completion that echoes its prompt may ask for no new token: its prompt's logprobs)
        echo = getattr(self, "echo", None)  # (None: a chat request, which has no echo)
        _check_optional_int("max_tokens", self.max_tokens, 0 if echo else 1,
                            note=" (0 only with echo: the prompt's logprobs)"
                            if echo is False else "")
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
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not _is_number(value):
                raise _type_error(name, "a number", value)
            if not -2.0 <= value <= 2.0:
                raise _range_error(name, "between -2 and 2", value)
            setattr(self, name, float(value))
        if not _is_number(self.repetition_penalty):
            raise _type_error("repetition_penalty", "a number", self.repetition_penalty)
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise _range_error("repetition_penalty", "greater than 0 and at most 10",
                               self.repetition_penalty)
        if not _is_number(self.min_p):
            raise _type_error("min_p", "a number", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise _range_error("min_p", "between 0 and 1", self.min_p)
        self.repetition_penalty = float(self.repetition_penalty)
        self.min_p = float(self.min_p)
        self.logit_bias = _check_logit_bias(self.logit_bias)
        self.response_format = _check_response_format(self.response_format)
        self.prediction = _check_prediction(self.prediction)

    @property
    def num_logprobs(self) -> int:
        """-1: no logprobs; k >= 0: the sampled token's and the k most likely tokens'."""
        if isinstance(self, ChatCompletionRequest):
            return (self.top_logprobs or 0) if self.logprobs else -1
        return -1 if self.logprobs is None else self.logprobs

    @property
    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple(sorted((int(k), float(v)) for k, v in (self.logit_bias or {}).items()))

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


_SAMPLING_KEYS = (
    "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
    "stream_options", "ignore_eos", "frequency_penalty", "presence_penalty", "logit_bias",
    "repetition_penalty", "min_p", "response_format", "logprobs", "prediction",
)
MAX_LOGIT_BIAS_ENTRIES = 1024


def _check_logit_bias(value: Any) -> dict[str, float] | None:
    """OpenAI's ``logit_bias``: token ids (JSON object keys, so strings) -> bias in
    [-100, 100]. Whether the ids exist is checked against the model's vocabulary later."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise _type_error("logit_bias", "an object mapping token ids to numbers", value)
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise _range_error("logit_bias", f"at most {MAX_LOGIT_BIAS_ENTRIES} entries",
                           f"{len(value)} entries")
    out: dict[str, float] = {}
    for key, bias in value.items():
        token = str(key)
        # ASCII digits only ("²" and "①" are digits to str.isdigit, and int("٣") is 3),
        # written as a token id is (no leading zeros)
        if not (token.isascii() and token.isdigit()) or len(token) > 9 or (
                token[0] == "0" and token != "0"):
            raise InvalidRequestError(
                f"Invalid key in 'logit_bias': {key!r} is not a token id.",
                param="logit_bias", code="invalid_value")
        if not _is_number(bias):
            raise _type_error(f"logit_bias.{token}", "a number", bias)
        if not -100.0 <= bias <= 100.0:
            raise _range_error(f"logit_bias.{token}", "between -100 and 100", bias)
        out[str(int(token))] = float(bias)
    return out


def _check_prediction(value: Any) -> dict[str, Any] | None:
    """OpenAI's ``prediction``: ``{"type": "content", "content": ...}``, the content a string
    or an array of ``{"type": "text", "text": ...}`` parts."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _type_error("prediction", "an object", value)
    for key in value:
        if key not in ("type", "content"):
            raise _unknown_field(f"prediction.{key}")
    if value.get("type") != "content":
        raise _range_error("prediction.type", "'content'", value.get("type"))
    content = value.get("content")
    if isinstance(content, str):
        return value
    if not isinstance(content, list):
        raise _type_error("prediction.content", "a string or an array of text parts", content)
    for i, part in enumerate(content):
        where = f"prediction.content[{i}]"
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                part.get("text"), str):
            raise _type_error(where, 'a text part ({"type": "text", "text": "..."})', part)
        for key in part:
            if key not in ("type", "text"):
                raise _unknown_field(f"{where}.{key}")
    return value


def prediction_text(value: dict[str, Any] | None) -> str:
    """The text of a checked ``prediction`` ("" for none)."""
    if value is None:
        return ""
    content = value["content"]
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


_SCHEMA_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def _check_response_format(value: Any) -> dict[str, Any] | None:
    """OpenAI's ``response_format`` (text, json_object, json_schema) and wick's
    ``{"type": "grammar", "grammar": "<xgrammar EBNF>"}``; returns None for plain text."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _type_error("response_format", "an object", value)
    kind = value.get("type")
    allowed = {"text": (), "json_object": (), "json_schema": ("json_schema",),
               "grammar": ("grammar",)}
    if not isinstance(kind, str) or kind not in allowed:  # (a list or object is unhashable)
        raise _range_error("response_format.type",
                           "one of 'text', 'json_object', 'json_schema', 'grammar'", kind)
    for key in value:
        if key != "type" and key not in allowed[kind]:
            raise _unknown_field(f"response_format.{key}")
    if kind == "text":
        return None
    if kind == "json_schema":
        spec = value.get("json_schema")
        where = "response_format.json_schema"
        if spec is None:
            raise InvalidRequestError(f"Missing required parameter: '{where}'.", param=where,
                                      code="missing_required_parameter")
        if not isinstance(spec, dict):
            raise _type_error(where, "an object", spec)
        for key in spec:
            if key not in ("name", "schema", "strict", "description"):
                raise _unknown_field(f"{where}.{key}")
        name = spec.get("name")
        if name is None:
            raise InvalidRequestError(f"Missing required parameter: '{where}.name'.",
                                      param=f"{where}.name", code="missing_required_parameter")
        if not isinstance(name, str) or not name or len(name) > 64 or \
                not set(name) <= _SCHEMA_NAME_CHARS:
            raise _range_error(f"{where}.name", "1 to 64 letters, digits, '_' or '-'", name)
        if spec.get("schema") is not None and not isinstance(spec["schema"], dict):
            raise _type_error(f"{where}.schema", "an object (a JSON schema)", spec["schema"])
        if spec.get("strict") is not None:
            _check_bool(f"{where}.strict", spec["strict"])
        if spec.get("description") is not None and not isinstance(spec["description"], str):
            raise _type_error(f"{where}.description", "a string", spec["description"])
    if kind == "grammar":
        grammar = value.get("grammar")
        if not isinstance(grammar, str):
            raise _type_error("response_format.grammar", "a non-empty EBNF string", grammar)
        if not grammar.strip():
            raise InvalidRequestError(
                "Invalid grammar in 'response_format.grammar': it is empty.",
                param="response_format.grammar", code="invalid_grammar")
    return value


def _split_fields(
    d: Any, own: tuple[str, ...], default_only: dict[str, tuple[Any, ...]],
    integers: frozenset[str] = _INTEGER_FIELDS,
) -> dict[str, Any]:
    """Check a request dict's keys; return the ones that become dataclass fields (integer
    fields given as integral floats made ints)."""
    if not isinstance(d, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_type")
    kwargs: dict[str, Any] = {}
    for key, value in d.items():
        if key in own or key in _SAMPLING_KEYS:
            # JSON null means "default" for every optional OpenAI field.
            if value is not None:
                kwargs[key] = _integral(value) if key in integers else value
        elif key in default_only:
            accepted = default_only[key]
            if not any(type(value) is type(a) and value == a for a in accepted):
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
    """One message: in a request (any role) or as a response's ``message`` (assistant).
    An assistant message may carry ``tool_calls`` (then ``content`` may be None); a "tool"
    message answers one of them by ``tool_call_id``."""

    role: str
    content: str | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # a reasoning model's thinking (engine/reasoning.py); in a request, an earlier reply's,
    # which the chat template may use or drop
    reasoning_content: str | None = None

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
            if key not in ("role", "content", "name", "tool_calls", "tool_call_id",
                           "reasoning_content"):
                if key in ("function_call", "audio", "refusal"):
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
        tool_calls = _check_tool_calls(d.get("tool_calls"), f"{where}.tool_calls", role)
        tool_call_id = d.get("tool_call_id")
        if role == "tool":
            if not isinstance(tool_call_id, str):
                raise InvalidRequestError(
                    f"Missing required parameter: '{where}.tool_call_id'.",
                    param=f"{where}.tool_call_id", code="missing_required_parameter")
        elif tool_call_id is not None:
            raise _unknown_field(f"{where}.tool_call_id")
        content = d.get("content")
        text = None if content is None and tool_calls else _content_text(content, where)
        reasoning = d.get("reasoning_content")
        if reasoning is not None and (role != "assistant" or not isinstance(reasoning, str)):
            raise _type_error(f"{where}.reasoning_content", "a string (assistant messages "
                              "only)", reasoning)
        return cls(role=role, content=text, name=name, tool_calls=tool_calls,
                   tool_call_id=tool_call_id, reasoning_content=reasoning)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        return out


def _check_tool_calls(value: Any, where: str, role: str) -> list[dict[str, Any]] | None:
    """An assistant message's earlier calls: ``[{"id", "type": "function", "function":
    {"name", "arguments": "<JSON text>"}}]``."""
    if value is None or value == []:
        return None
    if role != "assistant":
        raise _unknown_field(where)
    if not isinstance(value, list):
        raise _type_error(where, "an array", value)
    calls = []
    for i, c in enumerate(value):
        w = f"{where}[{i}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or \
                not isinstance(fn.get("arguments"), str) or \
                not isinstance(c.get("id", ""), str) or c.get("type", "function") != "function":
            raise InvalidRequestError(
                f"Invalid value for '{w}': expected {{\"id\", \"type\": \"function\", "
                "\"function\": {\"name\", \"arguments\"}} with string id, name and arguments.",
                param=w, code="invalid_value")
        calls.append({"id": c.get("id", ""), "type": "function",
                      "function": {"name": fn["name"], "arguments": fn["arguments"]}})
    return calls


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


# the reasoning efforts open models know (gpt-oss's; vLLM accepts these three): a chat template
# that reads ``reasoning_effort`` gets the request's, as vLLM passes it; others ignore it
REASONING_EFFORTS = ("low", "medium", "high")

# what the engine itself passes to a chat template; a request may not set these
TEMPLATE_RESERVED = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")


def _check_template_kwargs(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise _type_error("chat_template_kwargs", "an object", value)
    for key in value:
        if key in TEMPLATE_RESERVED:
            raise InvalidRequestError(
                f"'chat_template_kwargs.{key}' is set by the engine and cannot be given.",
                param=f"chat_template_kwargs.{key}", code="invalid_value")


@dataclass(slots=True)
class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = field(default_factory=list)
    top_logprobs: int | None = None  # needs logprobs: true
    tools: list[Any] | None = None  # OpenAI's function tools (checked by engine/tools.py)
    tool_choice: Any = None  # "none" | "auto" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool = True
    # extra variables for the chat template, e.g. {"enable_thinking": false} (vLLM's field)
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None  # the template's variable of that name

    def __post_init__(self) -> None:
        SamplingFields.__post_init__(self)
        if self.reasoning_effort is not None and self.reasoning_effort not in REASONING_EFFORTS:
            raise InvalidRequestError(
                f"Invalid value for 'reasoning_effort': {self.reasoning_effort!r}; expected one "
                f"of {', '.join(REASONING_EFFORTS)}.", param="reasoning_effort",
                code="invalid_value")
        if not isinstance(self.messages, list):
            raise _type_error("messages", "an array", self.messages)
        if not self.messages:
            raise InvalidRequestError(
                "'messages' must contain at least one message.", param="messages",
                code="invalid_value",
            )
        self.messages = [ChatMessage.from_dict(m, i) for i, m in enumerate(self.messages)]
        if self.logprobs is not None:
            _check_bool("logprobs", self.logprobs)
        _check_optional_int("top_logprobs", self.top_logprobs, 0, MAX_TOP_LOGPROBS)
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError(
                "'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs",
                code="invalid_value")
        _check_bool("parallel_tool_calls", self.parallel_tool_calls)
        _check_template_kwargs(self.chat_template_kwargs)
        from .tools import parse_tool_choice, parse_tools

        tools = parse_tools(self.tools) if self.tools is not None else []
        self.tool_choice = parse_tool_choice(self.tool_choice, tools)
        self.tools = tools or None
        if self.tools and self.tool_choice != "none" and self.response_format is not None:
            raise InvalidRequestError(
                "'response_format' cannot be combined with 'tools' (unless tool_choice is "
                "'none'): the tool calls have their own format.", param="response_format",
                code="invalid_value")

    @classmethod
    def from_dict(cls, d: Any) -> ChatCompletionRequest:
        kwargs = _split_fields(d, ("messages", "max_completion_tokens", "top_logprobs", "tools",
                                   "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
                                   "reasoning_effort"),
                               _DEFAULT_ONLY_CHAT)
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
    # the prompt before the completion's text, and (with logprobs) each prompt token's logprob
    # after the first (OpenAI's legacy echo; lm-evaluation-harness scores with it)
    echo: bool = False

    def __post_init__(self) -> None:
        _check_bool("echo", self.echo)
        SamplingFields.__post_init__(self)
        # the legacy shape: how many most likely tokens to list beside each sampled one
        _check_optional_int("logprobs", self.logprobs, 0, MAX_TOP_LOGPROBS)
        p = self.prompt
        if isinstance(p, str):
            if p == "":
                raise _range_error("prompt", "a non-empty string or token list", p)
        elif isinstance(p, list) and p and all(_is_int(t) for t in p):
            if any(t < 0 for t in p):
                raise _range_error("prompt", "non-negative token ids", p)
        elif isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            # A batch of one: unwrap (OpenAI clients often send [prompt]).
            self.prompt = token_ids_of(p[0]) if isinstance(p[0], list) else p[0]
            self.__post_init__()
        elif isinstance(p, list) and len(p) > 1 and all(isinstance(x, (str, list)) for x in p):
            raise UnsupportedParameterError(
                "prompt", "Batched prompts are not supported; send one request per prompt."
            )
        else:
            raise _type_error("prompt", "a string or a list of token ids", p)

    @classmethod
    def from_dict(cls, d: Any) -> CompletionRequest:
        # (a completion's logprobs is a count; a chat's a boolean)
        kwargs = _split_fields(d, ("prompt", "best_of", "echo"), _DEFAULT_ONLY_COMPLETION,
                               _INTEGER_FIELDS | {"logprobs"})
        if isinstance(kwargs.get("prompt"), list):
            kwargs["prompt"] = token_ids_of(kwargs["prompt"])
        if "prompt" not in kwargs:
            raise InvalidRequestError(
                "Missing required parameter: 'prompt'.", param="prompt",
                code="missing_required_parameter",
            )
        best_of = kwargs.pop("best_of", None)
        if best_of is not None and (not _is_int(best_of) or best_of != kwargs.get("n", 1)):
            raise UnsupportedParameterError("best_of")
        return cls(**kwargs)


# ---------------------------------------------------------------------------------------------
# Responses


@dataclass(slots=True)
class PromptTokensDetails:
    cached_tokens: int = 0  # prompt tokens whose KV the prefix cache gave (not computed)

    def to_dict(self) -> dict[str, Any]:
        return {"cached_tokens": self.cached_tokens}


@dataclass(slots=True)
class CompletionTokensDetails:
    # drafted tokens (a request's prediction, or engine-level speculation) the output kept,
    # and those it did not (OpenAI's predicted outputs report both)
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"accepted_prediction_tokens": self.accepted_prediction_tokens,
                "rejected_prediction_tokens": self.rejected_prediction_tokens}


@dataclass(slots=True)
class CompletionUsage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int = -1  # filled in from the two above
    prompt_tokens_details: PromptTokensDetails = field(default_factory=PromptTokensDetails)
    completion_tokens_details: CompletionTokensDetails = field(
        default_factory=CompletionTokensDetails)

    def __post_init__(self) -> None:
        if self.total_tokens < 0:
            self.total_tokens = self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": self.prompt_tokens_details.to_dict(),
            "completion_tokens_details": self.completion_tokens_details.to_dict(),
        }


@dataclass(slots=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: list[int] | None

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "bytes": self.bytes}


@dataclass(slots=True)
class TokenLogprob:
    """One sampled token's entry in ``choices[i].logprobs.content``."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "bytes": self.bytes,
                "top_logprobs": [t.to_dict() for t in self.top_logprobs]}


@dataclass(slots=True)
class ChoiceLogprobs:
    content: list[TokenLogprob]

    def to_dict(self) -> dict[str, Any]:
        return {"content": [t.to_dict() for t in self.content], "refusal": None}


@dataclass(slots=True)
class CompletionLogprobs:
    """The completions API's legacy shape: parallel lists, one entry per sampled token."""

    tokens: list[str] = field(default_factory=list)
    # (None: an echoed prompt's first token, which nothing predicts)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def extend(self, more: CompletionLogprobs) -> CompletionLogprobs:
        """These entries followed by ``more``'s (offsets as ``more`` has them)."""
        self.tokens += more.tokens
        self.token_logprobs += more.token_logprobs
        self.top_logprobs += more.top_logprobs
        self.text_offset += more.text_offset
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs, "text_offset": self.text_offset}


def _check_finish(reason: str | None) -> None:
    if reason is not None and reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {reason!r}")


@dataclass(slots=True)
class ChatCompletionChoice:
    index: int
    message: ChatMessage
    finish_reason: FinishReason | None
    logprobs: ChoiceLogprobs | None = None

    def __post_init__(self) -> None:
        _check_finish(self.finish_reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "message": self.message.to_dict(),
            "logprobs": self.logprobs.to_dict() if self.logprobs is not None else None,
            "finish_reason": self.finish_reason,
        }


@dataclass(slots=True)
class ChatCompletion:
    id: str  # "chatcmpl-..."
    created: int  # unix seconds
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage
    object: Literal["chat.completion"] = "chat.completion"

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
    reasoning_content: str | None = None
    # whole calls, each with its "index" among the choice's calls (OpenAI streams a call in
    # pieces joined by index; wick sends each complete, once parsed)
    tool_calls: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.role is not None:
            out["role"] = self.role
        if self.content is not None:
            out["content"] = self.content
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


@dataclass(slots=True)
class ChunkChoice:
    index: int
    delta: ChoiceDelta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None

    def __post_init__(self) -> None:
        _check_finish(self.finish_reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "delta": self.delta.to_dict(),
            "logprobs": self.logprobs.to_dict() if self.logprobs is not None else None,
            "finish_reason": self.finish_reason,
        }


@dataclass(slots=True)
class ChatCompletionChunk:
    id: str  # the same for every chunk of one request
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None  # only on the final chunk, when include_usage
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"

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
    logprobs: CompletionLogprobs | None = None

    def __post_init__(self) -> None:
        _check_finish(self.finish_reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "index": self.index,
            "logprobs": self.logprobs.to_dict() if self.logprobs is not None else None,
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
    object: Literal["text_completion"] = "text_completion"

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
