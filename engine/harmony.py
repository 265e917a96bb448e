"""OpenAI's harmony format (gpt-oss): a reply is a run of messages, each with a channel.

After the prompt's ``<|start|>assistant`` the model writes, for example::

    <|channel|>analysis<|message|>The user asks ...<|end|>
    <|start|>assistant<|channel|>final<|message|>It is 4.<|return|>

or, calling a function (the recipient in the channel's header or in the role's)::

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>

The API returns the ``analysis`` channel as ``reasoning_content``, the ``final`` channel (and
``commentary`` written to the user, a preamble) as ``content``, and each message to
``functions.NAME`` as a tool call, as vLLM and Ollama do for gpt-oss. ``<|return|>`` and
``<|call|>`` end the reply (stop tokens, never text). Messages to built-in tools the server does
not run (``browser.*``, ``python``) are the model's own work: reasoning.

The markers are special tokens, so a harmony reply is decoded with them kept
(``SamplingParams.skip_special_tokens=False``) and split here, as it streams: a message's header
is never shown; its body goes out as it comes, except a call's, which goes out whole when the
message ends.
"""

from __future__ import annotations

import json
import re

from .tokenizer import Tokenizer
from .tools import ToolCall, partial_suffix

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
# the reply ends at these (gpt-oss's stop tokens: its generation_config's end ids)
STOP_MARKERS = (RETURN, CALL, "<|endoftext|>")
_BODY_ENDS = (END, CALL, RETURN)
# what a reply's (or a message's) header may start with; anything else is plain text
_HEADER_STARTS = (CHANNEL, START, "to=", CONSTRAIN)
_RECIPIENT = re.compile(r"(?:^|\s)to=(\S+)")
FUNCTIONS = "functions."


HARMONY_TOOL_CHOICE = (
    "This model writes tool calls in OpenAI's harmony format (gpt-oss), which wick does not "
    "constrain: use tool_choice 'auto' (the default) and the model decides when to call.")


def harmony_stop_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    """The ids of ``<|return|>``, ``<|call|>`` and ``<|endoftext|>`` where the vocabulary has
    them as single tokens (a GGUF may name only one of them its end of text)."""
    ids = (tokenizer.encode(marker) for marker in STOP_MARKERS)
    return tuple(i[0] for i in ids if len(i) == 1)


def is_harmony(chat_template: str | None) -> bool:
    """Whether a chat template writes harmony (gpt-oss's: it opens messages with ``<|start|>``
    and names their channels)."""
    return bool(chat_template) and all(m in chat_template for m in (START, CHANNEL, MESSAGE))


def _first(text: str, markers: tuple[str, ...]) -> tuple[int, str]:
    """The first of ``markers`` in ``text``: (where, which); (-1, "") when none is."""
    hits = [(at, m) for m in markers if (at := text.find(m)) >= 0]
    return min(hits) if hits else (-1, "")


class HarmonyParser:
    """Splits one choice's harmony text into (reasoning, content) and tool calls, as it
    streams. ``tools``: whether the request gave functions (else a call is shown as content)."""

    def __init__(self, tools: bool = True) -> None:
        self.tools = tools
        self._phase = "header"  # header -> body -> header ...; or "plain" (not harmony)
        self._header = ""  # the header read so far (never shown)
        self._held = ""  # body text that may be the start of a marker
        self._kind = "content"  # where the current body goes: reasoning | content | call
        self._call_name = ""
        self._call_body: list[str] = []

    def push(self, text: str) -> tuple[str, str, list[ToolCall]]:
        """(reasoning, content, calls completed) to emit for ``text``."""
        out = {"reasoning": [], "content": [], "calls": []}
        text, self._held = self._held + text, ""
        while text:
            if self._phase == "plain":
                out["content"].append(text)
                break
            if self._phase == "header":
                text = self._read_header(text)
                continue
            at, marker = _first(text, _BODY_ENDS)
            if at < 0:
                keep = partial_suffix(text, *_BODY_ENDS)
                self._body(text[:len(text) - keep], out)
                self._held = text[len(text) - keep:]
                break
            self._body(text[:at], out)
            self._close(out)
            text = text[at + len(marker):]
        return "".join(out["reasoning"]), "".join(out["content"]), out["calls"]

    def finish(self, stopped: bool = True) -> tuple[str, str, list[ToolCall]]:
        """What is left when the reply ends: a stop token (``stopped``) closes its last
        message; a reply cut off (max_tokens) leaves a call unfinished, which is content."""
        out = {"reasoning": [], "content": [], "calls": []}
        if self._phase == "body":
            self._body(self._held, out)
            self._close(out, complete=stopped)
        elif self._phase == "header" and not self._header.lstrip().startswith(_HEADER_STARTS):
            out["content"].append(self._header)  # a reply that never opened a message
        self._held = self._header = ""
        return "".join(out["reasoning"]), "".join(out["content"]), out["calls"]

    def _read_header(self, text: str) -> str:
        """Take header text; return what follows it (the body), or "" while it goes on."""
        header = self._header + text
        lead = header.lstrip()
        if lead and not any(s.startswith(lead[:len(s)]) for s in _HEADER_STARTS):
            self._phase, self._header = "plain", ""  # no header: the model wrote plain text
            return header
        at = header.find(MESSAGE)
        if at < 0:
            self._header = header
            return ""
        self._open(header[:at])
        self._header, self._phase = "", "body"
        return header[at + len(MESSAGE):]

    def _open(self, header: str) -> None:
        header = header.replace(CONSTRAIN, " ")
        words = header.split(CHANNEL, 1)[1].split() if CHANNEL in header else []
        channel = words[0] if words else ""
        recipient = m.group(1) if (m := _RECIPIENT.search(header.replace(CHANNEL, " "))) else ""
        if recipient.startswith(FUNCTIONS) and self.tools:
            self._kind, self._call_name, self._call_body = "call", recipient[len(FUNCTIONS):], []
        elif recipient and not recipient.startswith(FUNCTIONS):
            self._kind = "reasoning"  # a built-in tool's call (browser, python): its own work
        elif channel == "analysis":
            self._kind = "reasoning"
        else:  # final, commentary to the user, or a call when no functions were given
            self._kind = "content"

    def _body(self, text: str, out: dict[str, list]) -> None:
        if not text:
            return
        if self._kind == "call":
            self._call_body.append(text)
        else:
            out[self._kind].append(text)

    def _close(self, out: dict[str, list], complete: bool = True) -> None:
        if self._kind == "call":
            body = "".join(self._call_body)
            try:  # arguments as OpenAI sends them: JSON text
                arguments = json.dumps(json.loads(body), ensure_ascii=False) if complete else None
            except ValueError:
                arguments = None
            if arguments is None:  # not a call after all (cut off, or not JSON): its text
                out["content"].append(body)
            else:
                out["calls"].append(ToolCall(self._call_name, arguments))
        self._phase, self._kind, self._call_body = "header", "content", []
