"""Function calling: OpenAI's ``tools`` / ``tool_choice`` on any chat model.

The model writes a call as a Hermes-style block, the format Qwen 2.5/3 and Hermes models are
trained on (and what wick's fallback prompt teaches the others)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

* Prompt: a chat template that knows ``tools`` (its source mentions them) renders them itself;
  otherwise wick adds a system message listing the functions and that format
  (``fallback_system_prompt``), and renders earlier calls and results as text in the history.
* Grammar: ``tool_choice`` "required" or a named function forces at least one call from the
  first token (xgrammar's ``tags_with_separator``); "auto" lets the model write text and
  constrains a call once it writes ``<tool_call>`` (``triggered_tags``). The arguments follow
  each function's ``parameters`` schema (compiled like a response_format schema).
* Output: ``ToolCallParser`` takes the blocks out of the text (also while streaming) and turns
  them into ``tool_calls``; the finish reason is then "tool_calls".
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidRequestError

CALL_BEGIN = "<tool_call>"
CALL_END = "</tool_call>"
TOOL_NAME_PATTERN = "^[A-Za-z0-9_-]{1,64}$"  # (the OpenAPI document says the same)
_NAME = re.compile(TOOL_NAME_PATTERN[1:-1])
MAX_TOOLS = 128  # OpenAI's bound


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})

    def to_openai(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


def _bad(param: str, message: str, code: str = "invalid_value") -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


def parse_tools(value: Any) -> list[Tool]:
    """OpenAI's ``tools``: ``[{"type": "function", "function": {"name", "description"?,
    "parameters"?, "strict"?}}]``."""
    if not isinstance(value, list):
        raise _bad("tools", f"Invalid type for 'tools': expected an array, but got "
                            f"{type(value).__name__}.", "invalid_type")
    if len(value) > MAX_TOOLS:
        raise _bad("tools", f"Invalid value for 'tools': at most {MAX_TOOLS} tools.")
    tools: list[Tool] = []
    for i, t in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or \
                not isinstance(t.get("function"), dict):
            raise _bad(where, f"Invalid value for '{where}': expected "
                              "{\"type\": \"function\", \"function\": {...}}.")
        for key in t:
            if key not in ("type", "function"):
                raise _bad(f"{where}.{key}", f"Unrecognized request argument supplied: "
                                             f"'{where}.{key}'.", "unknown_parameter")
        fn = t["function"]
        for key in fn:
            if key not in ("name", "description", "parameters", "strict"):
                raise _bad(f"{where}.function.{key}", "Unrecognized request argument supplied: "
                           f"'{where}.function.{key}'.", "unknown_parameter")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _bad(f"{where}.function.name", f"Invalid value for '{where}.function.name': "
                       f"{name!r}; it must be 1 to 64 letters, digits, '_' or '-'.")
        if any(other.name == name for other in tools):
            raise _bad(f"{where}.function.name", f"Duplicate function name {name!r} in 'tools'.")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise _bad(f"{where}.function.description", f"Invalid type for "
                       f"'{where}.function.description': expected a string.", "invalid_type")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise _bad(f"{where}.function.strict", f"Invalid type for "
                       f"'{where}.function.strict': expected a boolean.", "invalid_type")
        parameters = fn.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise _bad(f"{where}.function.parameters", f"Invalid type for "
                       f"'{where}.function.parameters': expected an object (a JSON schema).",
                       "invalid_type")
        tools.append(Tool(name, description or "", parameters))
    return tools


def parse_tool_choice(value: Any, tools: list[Tool]) -> str:
    """"none" | "auto" | "required" | a function name (``{"type": "function", "function":
    {"name": ...}}``, which must be one of ``tools``)."""
    if value is None:
        return "auto" if tools else "none"
    if value in ("none", "auto", "required"):
        if value == "required" and not tools:
            raise _bad("tool_choice", "'tool_choice' is 'required' but no 'tools' are given.")
        return value
    if isinstance(value, dict) and value.get("type") == "function" and \
            isinstance(value.get("function"), dict) and isinstance(
                value["function"].get("name"), str):
        name = value["function"]["name"]
        if not any(t.name == name for t in tools):
            raise _bad("tool_choice", f"Invalid value for 'tool_choice': function {name!r} is "
                       f"not in 'tools' ({', '.join(t.name for t in tools) or 'none given'}).")
        return name
    raise _bad("tool_choice", "Invalid value for 'tool_choice': expected 'none', 'auto', "
               "'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}.")


# ---------------------------------------------------------------------------------------------
# Prompt


def template_knows_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


def fallback_system_prompt(tools: list[Tool]) -> str:
    """What a model whose template has no tools support is told (the Hermes convention)."""
    listing = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
    return (
        "You may call one or more functions to help with the user's request. The functions "
        f"are listed inside <tools></tools>:\n<tools>\n{listing}\n</tools>\n\n"
        "To call a function, answer with a JSON object holding its name and arguments inside "
        f"{CALL_BEGIN}{CALL_END} tags:\n{CALL_BEGIN}\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n' + CALL_END)


def call_text(name: str, arguments: Any) -> str:
    """A call as the model writes it (compact JSON, as the grammar allows)."""
    return (f"{CALL_BEGIN}\n" + json.dumps({"name": name, "arguments": arguments},
                                           ensure_ascii=False) + f"\n{CALL_END}")


def history_as_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For templates without tools support: earlier calls become the assistant's text, tool
    results a user turn in <tool_response> tags (as Hermes-format models expect)."""
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [call_text(c["function"]["name"], _loads_or_text(c["function"]["arguments"]))
                     for c in m["tool_calls"]]
            text = "\n".join(([m["content"]] if m.get("content") else []) + calls)
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            out.append({"role": "user",
                        "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"})
        else:
            out.append(m)
    return out


def _loads_or_text(s: str) -> Any:
    try:
        return json.loads(s)
    except (TypeError, ValueError):
        return s


# ---------------------------------------------------------------------------------------------
# Grammar


def tools_spec_source(tools: list[Tool], choice: str, parallel: bool) -> str:
    """The ``GrammarSpec("tool_calls", source)`` source: which functions, how forced."""
    chosen = [t for t in tools if choice in ("auto", "required") or t.name == choice]
    return json.dumps({"mode": "auto" if choice == "auto" else "required", "parallel": parallel,
                       "tools": [{"name": t.name, "parameters": t.parameters} for t in chosen]})


def tool_parameter_schemas(source: str) -> list[str]:
    """Each function's parameters schema as JSON text, in order (the backend turns each into
    EBNF the way it does a response_format schema)."""
    return [json.dumps(t["parameters"]) for t in json.loads(source)["tools"]]


def structural_tag(source: str, argument_grammars: list[str]) -> str:
    """xgrammar's structural tag (JSON) for a "tool_calls" spec, given each function's
    arguments as EBNF (``root`` rule)."""
    spec = json.loads(source)
    tags = [{"type": "tag", "begin": f'{CALL_BEGIN}\n{{"name": {json.dumps(t["name"])}, '
                                     '"arguments": ',
             "content": {"type": "grammar", "grammar": ebnf}, "end": f"}}\n{CALL_END}"}
            for t, ebnf in zip(spec["tools"], argument_grammars)]
    if spec["mode"] == "auto":
        fmt = {"type": "triggered_tags", "triggers": [CALL_BEGIN], "tags": tags,
               "at_least_one": False, "stop_after_first": not spec["parallel"]}
    else:
        fmt = {"type": "tags_with_separator", "tags": tags, "separator": "\n",
               "at_least_one": True, "stop_after_first": not spec["parallel"]}
    return json.dumps({"type": "structural_tag", "format": fmt})


# ---------------------------------------------------------------------------------------------
# Output


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class ToolCallParser:
    """Splits a choice's text, as it streams, into content and tool calls. Text that might be
    the start of ``<tool_call>`` is held back until it is known; a block is turned into a call
    when it closes (or, unclosed, at the end)."""

    def __init__(self) -> None:
        self._buffer = ""
        self.calls: list[ToolCall] = []

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content that is certain now, calls completed now)."""
        self._buffer += text
        content, calls = [], []
        while True:
            start = self._buffer.find(CALL_BEGIN)
            if start < 0:
                keep = partial_suffix(self._buffer, CALL_BEGIN)
                content.append(self._buffer[:len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep:]
                break
            content.append(self._buffer[:start])
            end = self._buffer.find(CALL_END, start)
            if end < 0:
                self._buffer = self._buffer[start:]
                break
            call = _parse_call(self._buffer[start + len(CALL_BEGIN):end])
            if call is not None:
                calls.append(call)
            else:  # not a call after all: leave it in the text
                content.append(self._buffer[start:end + len(CALL_END)])
            self._buffer = self._buffer[end + len(CALL_END):]
        self.calls += calls
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self._buffer = self._buffer, ""
        if rest.startswith(CALL_BEGIN):
            call = _parse_call(rest[len(CALL_BEGIN):])
            if call is not None:
                self.calls.append(call)
                return "", [call]
        return rest, []


def partial_suffix(text: str, *tags: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``tags``
    (text a stream must hold back until it knows whether a tag comes)."""
    for n in range(min(max(len(t) for t in tags) - 1, len(text)), 0, -1):
        if any(len(t) > n and text.endswith(t[:n]) for t in tags):
            return n
    return 0


def _parse_call(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))
